#!/bin/sh -e
# mimic netemu render --backend netem: htb class + netem leaf per pipe, hashed u32 filters
# WARNING: 3 pipes rendered WITHOUT their ACK policy (delayed-ACK shaping needs mimic's datapath)
# upstream pipes on eth1 egress, downstream pipes on eth0 egress
# mimic's root qdisc is handle 6d69: (re-applying replaces it); another root qdisc makes `qdisc add` fail: remove it, or use `mimic netemu render --apply --force`
# netem has no seed: loss patterns differ from mimic's datapath run to run
# --- eth1 (client -> server)
tc qdisc del dev eth1 root handle 6d69: 2>/dev/null || true
tc qdisc add dev eth1 root handle 6d69: stab overhead -14 htb default 1
tc class add dev eth1 parent 6d69: classid 6d69:1 htb rate 10gbit ceil 10gbit quantum 1514
# IPv4 flow rules: u32 hash table 100: with 256 buckets keyed on the last octet of the client address
tc filter add dev eth1 parent 6d69: prio 1 handle 100: protocol ip u32 divisor 256
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at 12 link 100:
# flow #1 198.19.0.1:20000 -> 198.18.0.1:80 up: delay=10572us,rate=unlimited,queue=40,seed=11400714819323198484
tc class add dev eth1 parent 6d69: classid 6d69:10 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:10 handle 10: netem limit 206525 delay 10572us
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:1: match ip protocol 6 0xff match ip src 198.19.0.1/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:10
# flow #2 198.19.0.2:20000 -> 198.18.0.1:80 up: delay=1213us,rate=unlimited,queue=40,seed=11400714819323198487,ack_every=2,ack_timeout=200ms
tc class add dev eth1 parent 6d69: classid 6d69:11 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:11 handle 11: netem limit 23732 delay 1213us
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:2: match ip protocol 6 0xff match ip src 198.19.0.2/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:11
# flow #3 198.19.0.3:20000 -> 198.18.0.1:80 up: delay=36127us,rate=unlimited,queue=10,seed=11400714819323198486,ack_every=2,ack_timeout=200ms
tc class add dev eth1 parent 6d69: classid 6d69:12 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:12 handle 12: netem limit 705616 delay 36127us
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:3: match ip protocol 6 0xff match ip src 198.19.0.3/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:12
# flow #4 198.19.0.4:20000 -> 198.18.0.1:80 up: delay=1039us,rate=unlimited,queue=40,seed=11400714819323198481
tc class add dev eth1 parent 6d69: classid 6d69:13 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:13 handle 13: netem limit 20333 delay 1039us
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:4: match ip protocol 6 0xff match ip src 198.19.0.4/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:13
# flow #5 198.19.0.5:20000 -> 198.18.0.1:80 up: delay=38322us,rate=unlimited,queue=10,seed=11400714819323198480,ack_every=2,ack_timeout=200ms
tc class add dev eth1 parent 6d69: classid 6d69:14 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:14 handle 14: netem limit 748487 delay 38322us
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:5: match ip protocol 6 0xff match ip src 198.19.0.5/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:14
# flow #6 198.19.0.6:20000 -> 198.18.0.1:80 up: delay=3487us,rate=unlimited,queue=40,seed=11400714819323198483
tc class add dev eth1 parent 6d69: classid 6d69:15 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth1 parent 6d69:15 handle 15: netem limit 68146 delay 3487us
tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:6: match ip protocol 6 0xff match ip src 198.19.0.6/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:15
# --- eth0 (server -> client)
tc qdisc del dev eth0 root handle 6d69: 2>/dev/null || true
tc qdisc add dev eth0 root handle 6d69: stab overhead -14 htb default 1
tc class add dev eth0 parent 6d69: classid 6d69:1 htb rate 10gbit ceil 10gbit quantum 1514
# IPv4 flow rules: u32 hash table 100: with 256 buckets keyed on the last octet of the client address
tc filter add dev eth0 parent 6d69: prio 1 handle 100: protocol ip u32 divisor 256
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at 16 link 100:
# flow #1 198.19.0.1:20000 -> 198.18.0.1:80 down: delay=10572us,rate=6944039bit,queue=40,loss=0.136249%,seed=11400714817801786753
tc class add dev eth0 parent 6d69: classid 6d69:10 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:10 handle 10: netem limit 47 delay 10572us rate 6944039bit loss random 0.136249%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:1: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.1/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:10
# flow #2 198.19.0.2:20000 -> 198.18.0.1:80 down: delay=1213us,rate=245528220bit,queue=40,loss=0.012352%,seed=11400714817801786754
tc class add dev eth0 parent 6d69: classid 6d69:11 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:11 handle 11: netem limit 65 delay 1213us rate 245528220bit loss random 0.012352%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:2: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.2/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:11
# flow #3 198.19.0.3:20000 -> 198.18.0.1:80 down: delay=36127us,rate=5821371bit,queue=30,loss=0.922147%,seed=11400714817801786755
tc class add dev eth0 parent 6d69: classid 6d69:12 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:12 handle 12: netem limit 48 delay 36127us rate 5821371bit loss random 0.922147%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:3: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.3/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:12
# flow #4 198.19.0.4:20000 -> 198.18.0.1:80 down: delay=1039us,rate=75675088bit,queue=40,loss=0.037936%,seed=11400714817801786756
tc class add dev eth0 parent 6d69: classid 6d69:13 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:13 handle 13: netem limit 47 delay 1039us rate 75675088bit loss random 0.037936%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:4: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.4/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:13
# flow #5 198.19.0.5:20000 -> 198.18.0.1:80 down: delay=38322us,rate=4958369bit,queue=30,loss=0.749289%,seed=11400714817801786757
tc class add dev eth0 parent 6d69: classid 6d69:14 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:14 handle 14: netem limit 46 delay 38322us rate 4958369bit loss random 0.749289%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:5: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.5/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:14
# flow #6 198.19.0.6:20000 -> 198.18.0.1:80 down: delay=3487us,rate=145785586bit,queue=40,loss=0.052497%,seed=11400714817801786758
tc class add dev eth0 parent 6d69: classid 6d69:15 htb rate 10gbit ceil 10gbit quantum 1514
tc qdisc add dev eth0 parent 6d69:15 handle 15: netem limit 83 delay 3487us rate 145785586bit loss random 0.052497%
tc filter add dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:6: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.0.6/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:15
