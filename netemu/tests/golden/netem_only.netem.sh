#!/bin/sh -e
# mimic netemu render --backend netem: htb class + netem leaf per pipe, hashed u32 filters
# upstream pipes on eth1 egress, downstream pipes on eth0 egress
# mimic's root qdisc is handle 6d69: (re-applying replaces it); another root qdisc makes `qdisc add` fail: remove it, or use `mimic netemu render --apply --force`
# netem has no seed: loss patterns differ from mimic's datapath run to run
# --- eth1 (client -> server)
tc qdisc del dev eth1 root handle 6d69: 2>/dev/null || true
tc qdisc add dev eth1 root handle 6d69: stab overhead -14 htb default 2
tc class add dev eth1 parent 6d69: classid 6d69:1 htb rate 10gbit ceil 10gbit quantum 1514
# default up: delay=1500us,rate=10mbit,overhead=38,queue=50,jitter=500us
tc class add dev eth1 parent 6d69: classid 6d69:2 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:2 handle 2: netem limit 52 delay 1500us 500us rate 10mbit 38
# --- eth0 (server -> client)
tc qdisc del dev eth0 root handle 6d69: 2>/dev/null || true
tc qdisc add dev eth0 root handle 6d69: stab overhead -14 htb default 2
tc class add dev eth0 parent 6d69: classid 6d69:1 htb rate 10gbit ceil 10gbit quantum 1514
# default down: delay=1500us,rate=10mbit,queue=50,ge=1%/30%/100%/0%
tc class add dev eth0 parent 6d69: classid 6d69:2 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:2 handle 2: netem limit 52 delay 1500us rate 10mbit loss gemodel 1% 30% 100% 0%
