-- mimic database schema, version 1.
-- One database per analysis, synthesis or replay run. Times are microseconds since the Unix
-- epoch (INTEGER); durations are microseconds; rates are bits per second; byte counts are
-- TCP payload bytes unless a column says otherwise. NULL means "not known / not measurable".
-- Column names are the contract that analyze, replay and compare rely on (see DESIGN.md).
-- Each CREATE INDEX stays on one line: bulk writers create indexes after loading the rows.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT
);

CREATE TABLE connections (
    id                 INTEGER PRIMARY KEY,
    client_ip          TEXT NOT NULL,
    client_port        INTEGER NOT NULL,
    server_ip          TEXT NOT NULL,
    server_port        INTEGER NOT NULL,
    vlan               INTEGER,            -- outermost VLAN id, NULL when untagged
    ip_version         INTEGER NOT NULL,   -- 4 or 6
    t_syn              INTEGER,            -- client SYN (first one seen); NULL without a SYN
    t_first            INTEGER NOT NULL,   -- first packet of the connection
    t_end              INTEGER NOT NULL,   -- last packet of the connection
    complete           INTEGER NOT NULL,   -- 1: handshake, termination and no sequence holes
    prune_reason       TEXT,               -- why not complete (comma-separated), NULL if complete
    server_by          TEXT NOT NULL,      -- how the server side was chosen: syn, synack, port, net, guess
    -- delay
    min_rtt_us         INTEGER,            -- min tap->client->tap + min tap->server->tap over handshake and Karn-valid data->ACK samples
    hs_rtt_us          INTEGER,            -- SYN -> client's ACK of the SYN-ACK at the capture point
    rtt_samples        INTEGER NOT NULL DEFAULT 0,  -- samples taken (rtt_samples rows keep the first ones and the minimum per direction)
    -- handshake options (from each side's SYN)
    mss_client         INTEGER,
    mss_server         INTEGER,
    wscale_client      INTEGER,
    wscale_server      INTEGER,
    sack_ok            INTEGER,            -- both SYNs carried SACK-permitted
    ts_ok              INTEGER,            -- both SYNs carried timestamps
    ecn_ok             INTEGER,            -- ECN negotiated (SYN with ECE+CWR, SYN-ACK with ECE)
    syn_retx           INTEGER NOT NULL DEFAULT 0,  -- client SYN retransmissions
    synack_retx        INTEGER NOT NULL DEFAULT 0,  -- server SYN-ACK retransmissions
    -- client receive window
    rwin_bytes         INTEGER,            -- scaled window at the first request segment
    rwin_syn_bytes     INTEGER,            -- window in the client's SYN (unscaled, as RFC 7323 says)
    zero_window        INTEGER NOT NULL DEFAULT 0,  -- client advertised a zero window
    -- downstream (server -> client) data and loss
    data_pkts_down     INTEGER NOT NULL DEFAULT 0,
    data_bytes_down    INTEGER NOT NULL DEFAULT 0, -- unique bytes
    retx_down          INTEGER NOT NULL DEFAULT 0,
    spurious_retx_down INTEGER NOT NULL DEFAULT 0,
    spurious_by        TEXT,               -- dsack or dupack (how spurious ones were detected)
    loss_rate_down     REAL,               -- (retx - spurious) / data segments sent
    loss_random_down   REAL,               -- the part the bottleneck queue does not explain: losses whose original was
                                           -- sent with no more in flight than bw x min RTT + the class queue (replayed as i.i.d.)
    -- upstream (client -> server)
    data_pkts_up       INTEGER NOT NULL DEFAULT 0,
    data_bytes_up      INTEGER NOT NULL DEFAULT 0,
    retx_up            INTEGER NOT NULL DEFAULT 0,
    fin_retx           INTEGER NOT NULL DEFAULT 0,  -- FINs sent again (either side)
    zwnd_probes        INTEGER NOT NULL DEFAULT 0,  -- data sent into a closed (zero) window, either side
    dup_frames         INTEGER NOT NULL DEFAULT 0,  -- frames captured more than once (same IPv4 datagram), ignored
    -- bottleneck bandwidth (packet pairs on the client's ACK spacing)
    bw_bps             REAL,
    bw_samples         INTEGER NOT NULL DEFAULT 0,
    -- client delayed-ACK policy in slow start
    delack_policy      TEXT NOT NULL DEFAULT 'unknown', -- quick / delayed / unknown
    acks_per_seg       REAL,
    delack_timeout_us  INTEGER,
    -- termination
    termination        TEXT NOT NULL,      -- fin / rst_after_response / rst_abort / none
    closed_by          TEXT,               -- client / server / NULL
    -- application level
    exchanges          INTEGER NOT NULL DEFAULT 0,
    response_time_us   INTEGER,            -- first request byte to last response byte
    holes_down         INTEGER NOT NULL DEFAULT 0,  -- sequence ranges never seen (server side)
    holes_up           INTEGER NOT NULL DEFAULT 0,
    frames             INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX connections_by_client ON connections(client_ip, client_port);

-- One row per request/response exchange (an application data unit each way).
CREATE TABLE exchanges (
    conn_id            INTEGER NOT NULL REFERENCES connections(id),
    seq                INTEGER NOT NULL,   -- 0-based order within the connection
    t_req_first        INTEGER,
    t_req_last         INTEGER,
    req_bytes          INTEGER NOT NULL,
    t_resp_first       INTEGER,
    t_resp_last        INTEGER,
    resp_bytes         INTEGER NOT NULL,
    response_delay_us  INTEGER,            -- last request packet -> first response packet
    query_delay_us     INTEGER,            -- first response packet -> first packet after the server's pause
    header_bytes       INTEGER,            -- response bytes sent before the query delay
    think_time_us      INTEGER,            -- previous response's last packet -> this request's first
    method             TEXT,               -- plaintext HTTP/1.x request method, when captured
    status             INTEGER,            -- plaintext HTTP/1.x response status, when captured
    PRIMARY KEY (conn_id, seq)
);

-- Packet pairs that qualified as bandwidth samples (two consecutive client ACKs advancing over
-- server segments sent in one burst, none retransmitted, spaced wider than the server sent them).
CREATE TABLE bw_samples (
    conn_id  INTEGER NOT NULL REFERENCES connections(id),
    t_us     INTEGER NOT NULL,             -- time of the second ACK of the pair
    bps      REAL NOT NULL,
    bytes    INTEGER NOT NULL,             -- bytes newly acknowledged by the second ACK
    gap_us   INTEGER NOT NULL,             -- spacing of the two ACKs
    used     INTEGER NOT NULL              -- 1 if the combiner used it for bw_bps (see meta bw_method)
);

CREATE TABLE rtt_samples (
    conn_id  INTEGER NOT NULL REFERENCES connections(id),
    t_us     INTEGER NOT NULL,
    rtt_us   INTEGER NOT NULL,
    kind     TEXT NOT NULL                 -- handshake (SYN -> client's ACK of the SYN-ACK), data (server data -> client ACK), upstream (client data -> server ACK)
);

-- Replay databases: which replayed connection reproduces which original one.
CREATE TABLE replay_map (
    orig_conn_id    INTEGER PRIMARY KEY,
    replay_conn_id  INTEGER,               -- NULL when the replayed connection failed or was not seen
    status          TEXT NOT NULL,          -- ok / failed / missing
    failure         TEXT,                   -- refused / reset / timeout / ... when failed
    client_ip       TEXT,                   -- the 4-tuple the replay used
    client_port     INTEGER,
    server_ip       TEXT,
    server_port     INTEGER
);

-- Replay databases: each replayed connection's emulated pipes, as configured and as the network
-- emulator counted them (packets accepted, dropped by the queue limit, dropped by the loss model).
CREATE TABLE replay_pipes (
    orig_conn_id       INTEGER PRIMARY KEY,
    one_way_delay_us   INTEGER NOT NULL,
    down_rate_bps      REAL,               -- NULL: no rate limit
    down_loss          REAL NOT NULL,
    queue_up           INTEGER NOT NULL,   -- packets
    queue_down         INTEGER NOT NULL,
    ack_every          INTEGER,            -- delayed-ACK shaping of the client's pure ACKs
    ack_timeout_us     INTEGER,
    up_packets         INTEGER,
    up_queue_drops     INTEGER,
    up_loss_drops      INTEGER,
    down_packets       INTEGER,
    down_bytes         INTEGER,
    down_queue_drops   INTEGER,
    down_loss_drops    INTEGER,
    down_max_queue     INTEGER
);
