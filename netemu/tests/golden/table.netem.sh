#!/bin/sh -e
# mimic netemu render --backend netem: htb class + netem leaf per pipe, hashed u32 filters
# upstream pipes on eth1 egress, downstream pipes on eth0 egress
# mimic's root qdisc is handle 6d69: (re-applying replaces it); another root qdisc makes `qdisc add` fail: remove it, or use `mimic netemu render --apply --force`
# netem has no seed: loss patterns differ from mimic's datapath run to run
# --- eth1 (client -> server)
tc qdisc del dev eth1 root handle 6d69: 2>/dev/null || true
tc qdisc add dev eth1 root handle 6d69: stab overhead -14 htb default 2
tc class add dev eth1 parent 6d69: classid 6d69:1 htb rate 10gbit ceil 10gbit quantum 1514
# IPv4 flow rules: u32 hash table 100: with 256 buckets keyed on the last octet of the client address
tc filter add dev eth1 parent 6d69: prio 1 handle 100: protocol ip u32 divisor 256
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at 12 link 100:
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 up: delay=12ms,rate=1mbit,queue=10
tc class add dev eth1 parent 6d69: classid 6d69:10 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:10 handle 10: netem limit 12 delay 12ms rate 1mbit
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:7: match ip protocol 6 0xff match ip src 198.19.0.7/32 match ip dst 198.18.0.1/32 match ip sport 40000 0xffff match ip dport 80 0xffff flowid 6d69:10
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 up: delay=3ms,rate=unlimited,queue=50
tc class add dev eth1 parent 6d69: classid 6d69:11 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:11 handle 11: netem limit 58644 delay 3ms
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:8: match ip protocol 6 0xff match ip src 198.19.0.8/32 match ip dst 198.18.0.1/32 match ip sport 40001 0xffff match ip dport 443 0xffff flowid 6d69:11
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 up: delay=40ms,rate=512kbit,queue=5
tc class add dev eth1 parent 6d69: classid 6d69:12 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:12 handle 12: netem limit 7 delay 40ms rate 512kbit
tc filter add dev eth1 parent 6d69: protocol ip prio 3 u32 match ip src 198.19.1.0/24 match ip dst 198.18.0.1/32 flowid 6d69:12
# default up: delay=20ms,rate=10mbit,queue=50
tc class add dev eth1 parent 6d69: classid 6d69:2 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:2 handle 2: netem limit 67 delay 20ms rate 10mbit
# --- eth0 (server -> client)
tc qdisc del dev eth0 root handle 6d69: 2>/dev/null || true
tc qdisc add dev eth0 root handle 6d69: stab overhead -14 htb default 2
tc class add dev eth0 parent 6d69: classid 6d69:1 htb rate 10gbit ceil 10gbit quantum 1514
# IPv4 flow rules: u32 hash table 100: with 256 buckets keyed on the last octet of the client address
tc filter add dev eth0 parent 6d69: prio 1 handle 100: protocol ip u32 divisor 256
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at 16 link 100:
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 down: delay=12ms,rate=6mbit,queue=30,loss=0.5%
tc class add dev eth0 parent 6d69: classid 6d69:10 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:10 handle 10: netem limit 37 delay 12ms rate 6mbit loss random 0.5%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:7: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.7/32 match ip sport 80 0xffff match ip dport 40000 0xffff flowid 6d69:10
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 down: delay=3ms,rate=100mbit,queue=40
tc class add dev eth0 parent 6d69: classid 6d69:11 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:11 handle 11: netem limit 66 delay 3ms rate 100mbit
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:8: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.8/32 match ip sport 443 0xffff match ip dport 40001 0xffff flowid 6d69:11
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 down: delay=40ms,rate=2mbit,queue=30
tc class add dev eth0 parent 6d69: classid 6d69:12 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:12 handle 12: netem limit 37 delay 40ms rate 2mbit
tc filter add dev eth0 parent 6d69: protocol ip prio 3 u32 match ip src 198.18.0.1/32 match ip dst 198.19.1.0/24 flowid 6d69:12
# default down: delay=20ms,rate=10mbit,queue=50,loss=1%
tc class add dev eth0 parent 6d69: classid 6d69:2 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:2 handle 2: netem limit 67 delay 20ms rate 10mbit loss random 1%
