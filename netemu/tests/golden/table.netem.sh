#!/bin/sh -e
# mimic netemu render --backend netem: htb class + netem leaf per pipe, u32 filters
# upstream pipes on eth1 egress, downstream pipes on eth0 egress
# netem has no seed: loss patterns differ from mimic's datapath run to run
# --- eth1 (client -> server)
tc qdisc replace dev eth1 root handle 1: stab overhead -14 htb default 2
tc class add dev eth1 parent 1: classid 1:1 htb rate 10gbit
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 up: delay=12ms,rate=1mbit,queue=10
tc class add dev eth1 parent 1: classid 1:10 htb rate 1mbit ceil 1mbit
tc qdisc add dev eth1 parent 1:10 handle 10: netem limit 12 delay 12ms
tc filter add dev eth1 parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff match ip src 198.19.0.7/32 match ip dst 198.18.0.1/32 match ip sport 40000 0xffff match ip dport 80 0xffff flowid 1:10
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 up: delay=3ms,rate=unlimited,queue=50
tc class add dev eth1 parent 1: classid 1:11 htb rate 10gbit ceil 10gbit
tc qdisc add dev eth1 parent 1:11 handle 11: netem limit 50 delay 3ms
tc filter add dev eth1 parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff match ip src 198.19.0.8/32 match ip dst 198.18.0.1/32 match ip sport 40001 0xffff match ip dport 443 0xffff flowid 1:11
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 up: delay=40ms,rate=512kbit,queue=5
tc class add dev eth1 parent 1: classid 1:12 htb rate 512kbit ceil 512kbit
tc qdisc add dev eth1 parent 1:12 handle 12: netem limit 7 delay 40ms
tc filter add dev eth1 parent 1: protocol ip prio 2 u32 match ip src 198.19.1.0/24 match ip dst 198.18.0.1/32 flowid 1:12
# default up: delay=20ms,rate=10mbit,queue=50
tc class add dev eth1 parent 1: classid 1:2 htb rate 10mbit ceil 10mbit
tc qdisc add dev eth1 parent 1:2 handle 2: netem limit 67 delay 20ms
# --- eth0 (server -> client)
tc qdisc replace dev eth0 root handle 1: stab overhead -14 htb default 2
tc class add dev eth0 parent 1: classid 1:1 htb rate 10gbit
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 down: delay=12ms,rate=6mbit,queue=30,loss=0.5%
tc class add dev eth0 parent 1: classid 1:10 htb rate 6mbit ceil 6mbit
tc qdisc add dev eth0 parent 1:10 handle 10: netem limit 37 delay 12ms loss random 0.5%
tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.7/32 match ip sport 80 0xffff match ip dport 40000 0xffff flowid 1:10
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 down: delay=3ms,rate=100mbit,queue=40
tc class add dev eth0 parent 1: classid 1:11 htb rate 100mbit ceil 100mbit
tc qdisc add dev eth0 parent 1:11 handle 11: netem limit 66 delay 3ms
tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.8/32 match ip sport 443 0xffff match ip dport 40001 0xffff flowid 1:11
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 down: delay=40ms,rate=2mbit,queue=30
tc class add dev eth0 parent 1: classid 1:12 htb rate 2mbit ceil 2mbit
tc qdisc add dev eth0 parent 1:12 handle 12: netem limit 37 delay 40ms
tc filter add dev eth0 parent 1: protocol ip prio 2 u32 match ip src 198.18.0.1/32 match ip dst 198.19.1.0/24 flowid 1:12
# default down: delay=20ms,rate=10mbit,queue=50,loss=1%
tc class add dev eth0 parent 1: classid 1:2 htb rate 10mbit ceil 10mbit
tc qdisc add dev eth0 parent 1:2 handle 2: netem limit 67 delay 20ms loss random 1%
