/* The only C in mimic: a thin shim over DPDK 22.11 for the Rust DPDK source
 * (capture/src/source/dpdk.rs). It exists because rte_eth_rx_burst, rte_pktmbuf_mtod,
 * rte_pktmbuf_read and friends are static-inline functions that Rust cannot call directly.
 * Every function returns plain integers and pointers; errors come back as negative errno
 * values with a message in the caller's buffer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <time.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>

static struct rte_mempool *mc_pool;
static int mc_ts_offset = -1;
static uint64_t mc_ts_flag;

/* A symmetric Toeplitz key: 0x6d5a repeated makes the RSS hash of (a,b) equal that of (b,a),
 * so both directions of a connection land on the same queue. */
static uint8_t mc_sym_rss_key[52] = {
    0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d,
    0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a,
    0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d,
    0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a,
};

int mc_eal_init(int argc, char **argv, char *err, size_t errlen) {
    int rc = rte_eal_init(argc, argv);
    if (rc < 0) {
        snprintf(err, errlen, "rte_eal_init failed: %s", rte_strerror(rte_errno));
        return -rte_errno;
    }
    return rc;
}

int mc_port_count(void) { return (int)rte_eth_dev_count_avail(); }

/* The PMD's driver name (e.g. "net_pcap"), for deciding what its timestamps mean. */
int mc_port_driver(uint16_t port, char *name, size_t len) {
    struct rte_eth_dev_info info;
    if (rte_eth_dev_info_get(port, &info) != 0 || info.driver_name == NULL) return -1;
    snprintf(name, len, "%s", info.driver_name);
    return 0;
}

/* The device's name (e.g. "net_pcap0", "0000:03:00.0"), for descriptions and errors. */
int mc_port_name(uint16_t port, char *name, size_t len) {
    char buf[RTE_ETH_NAME_MAX_LEN];
    if (rte_eth_dev_get_name_by_port(port, buf) != 0) return -1;
    snprintf(name, len, "%s", buf);
    return 0;
}

/* How many RX queues the device can have (0 when it cannot be asked). */
int mc_port_max_rx_queues(uint16_t port) {
    struct rte_eth_dev_info info;
    if (rte_eth_dev_info_get(port, &info) != 0) return 0;
    return (int)info.max_rx_queues;
}

/* The device's raw clock (the unit of its RX timestamps), or a negative errno when the PMD
 * cannot read it (-ENOTSUP). */
int mc_read_clock(uint16_t port, uint64_t *ticks) { return rte_eth_read_clock(port, ticks); }

/* The CPU's time-stamp counter and its rate, as the EAL measured it. */
uint64_t mc_rdtsc(void) { return rte_rdtsc(); }
uint64_t mc_tsc_hz(void) { return rte_get_tsc_hz(); }

/* Configures and starts `port` with `*nb_queues` RX queues (lowered to what the device
 * supports; the value used is written back). Returns 0 or a negative errno.
 * *rss is set to 1 when a symmetric RSS key was programmed, *hw_ts to 1 when the device
 * offers the RX timestamp offload (turned on), 2 when it does not but mbufs may still carry a
 * timestamp (net_pcap stamps with the file's time without advertising the offload). */
int mc_port_setup(uint16_t port, uint16_t *nb_queues, uint16_t nb_desc, uint32_t nb_mbufs,
                  int *rss, int *hw_ts, char *err, size_t errlen) {
    struct rte_eth_dev_info info;
    struct rte_eth_conf conf;
    int rc;
    uint16_t q;

    rc = rte_eth_dev_info_get(port, &info);
    if (rc != 0) {
        snprintf(err, errlen, "rte_eth_dev_info_get(port %u): %s", port, strerror(-rc));
        return rc;
    }
    if (*nb_queues > info.max_rx_queues) *nb_queues = info.max_rx_queues;
    if (*nb_queues == 0) *nb_queues = 1;

    memset(&conf, 0, sizeof conf);
    *rss = 0;
    if (*nb_queues > 1 && info.flow_type_rss_offloads != 0) {
        conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_key = mc_sym_rss_key;
        conf.rx_adv_conf.rss_conf.rss_key_len =
            info.hash_key_size && info.hash_key_size <= sizeof mc_sym_rss_key ? info.hash_key_size : 40;
        conf.rx_adv_conf.rss_conf.rss_hf =
            (RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
        *rss = 1;
    }
    *hw_ts = 0;
    if (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_TIMESTAMP) {
        conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_TIMESTAMP;
        if (rte_mbuf_dyn_rx_timestamp_register(&mc_ts_offset, &mc_ts_flag) == 0) *hw_ts = 1;
    }

    if (mc_pool == NULL) {
        mc_pool = rte_pktmbuf_pool_create("mimic_rx", nb_mbufs, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
                                          rte_eth_dev_socket_id(port) < 0 ? SOCKET_ID_ANY : rte_eth_dev_socket_id(port));
        if (mc_pool == NULL) {
            snprintf(err, errlen, "creating the mbuf pool (%u mbufs): %s (give EAL more memory, e.g. -m 512)",
                     nb_mbufs, rte_strerror(rte_errno));
            return -rte_errno;
        }
    }
    rc = rte_eth_dev_configure(port, *nb_queues, 0, &conf);
    if (rc != 0) {
        snprintf(err, errlen, "rte_eth_dev_configure(port %u, %u rx queues): %s", port, *nb_queues, strerror(-rc));
        return rc;
    }
    uint16_t rxd = nb_desc;
    uint16_t txd = 0;
    rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    for (q = 0; q < *nb_queues; q++) {
        struct rte_eth_rxconf rxconf = info.default_rxconf;
        rxconf.offloads = conf.rxmode.offloads;
        rc = rte_eth_rx_queue_setup(port, q, rxd, rte_eth_dev_socket_id(port) < 0 ? SOCKET_ID_ANY : rte_eth_dev_socket_id(port),
                                    &rxconf, mc_pool);
        if (rc != 0) {
            snprintf(err, errlen, "rte_eth_rx_queue_setup(port %u, queue %u): %s", port, q, strerror(-rc));
            return rc;
        }
    }
    rc = rte_eth_dev_start(port);
    if (rc != 0) {
        snprintf(err, errlen, "rte_eth_dev_start(port %u): %s", port, strerror(-rc));
        return rc;
    }
    rte_eth_promiscuous_enable(port); /* not every PMD supports it; failure is harmless */
    if (mc_ts_offset < 0) {
        /* some PMDs (net_pcap) stamp mbufs without advertising the offload: use their
         * timestamp whenever the RX-timestamp dynamic field and flag are registered */
        int off = rte_mbuf_dynfield_lookup(RTE_MBUF_DYNFIELD_TIMESTAMP_NAME, NULL);
        int bit = rte_mbuf_dynflag_lookup(RTE_MBUF_DYNFLAG_RX_TIMESTAMP_NAME, NULL);
        if (off >= 0 && bit >= 0) {
            mc_ts_offset = off;
            mc_ts_flag = 1ULL << bit;
        }
    }
    /* 2: the device does not advertise RX timestamps but the field exists (another port or
     * the PMD itself registered it); each mbuf's flag says whether it carries one */
    if (*hw_ts == 0 && mc_ts_offset >= 0) *hw_ts = 2;
    return 0;
}

uint16_t mc_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **bufs, uint16_t n) {
    return rte_eth_rx_burst(port, queue, bufs, n);
}

/* The first `want` bytes of the packet (or all of it if shorter), contiguous: a pointer into
 * the mbuf, or into `copy` when the packet spans segments. *pkt_len gets the packet length. */
const uint8_t *mc_mbuf_bytes(struct rte_mbuf *m, uint32_t want, uint8_t *copy, uint32_t *got, uint32_t *pkt_len) {
    uint32_t len = rte_pktmbuf_pkt_len(m);
    uint32_t n = want < len ? want : len;
    *pkt_len = len;
    *got = n;
    return (const uint8_t *)rte_pktmbuf_read(m, 0, n, copy);
}

/* The RX timestamp of the mbuf, or -1 when it has none. */
int64_t mc_mbuf_timestamp(const struct rte_mbuf *m) {
    if (mc_ts_offset < 0 || !(m->ol_flags & mc_ts_flag)) return -1;
    return (int64_t)*RTE_MBUF_DYNFIELD(m, mc_ts_offset, rte_mbuf_timestamp_t *);
}

void mc_free_bulk(struct rte_mbuf **bufs, unsigned int n) { rte_pktmbuf_free_bulk(bufs, n); }

int mc_port_stats(uint16_t port, uint64_t *ipackets, uint64_t *imissed, uint64_t *ierrors, uint64_t *nombuf) {
    struct rte_eth_stats s;
    int rc = rte_eth_stats_get(port, &s);
    if (rc != 0) return rc;
    *ipackets = s.ipackets;
    *imissed = s.imissed;
    *ierrors = s.ierrors;
    *nombuf = s.rx_nombuf;
    return 0;
}

int mc_thread_register(void) { return rte_thread_register(); }
void mc_thread_unregister(void) { rte_thread_unregister(); }

void mc_port_close(uint16_t port) {
    rte_eth_dev_stop(port);
    rte_eth_dev_close(port);
}

void mc_eal_cleanup(void) { rte_eal_cleanup(); }
