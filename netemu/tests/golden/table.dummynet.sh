#!/bin/sh -e
# mimic netemu render --backend dummynet: one dummynet pipe per mimic pipe, ipfw rules in table order
# mimic's rules are in set 29 (flows 50000, prefixes from 50001, default 59999), its pipes numbered from 32768; re-applying replaces them
# dummynet counts IP bytes for bw, as mimic does; plr is not seeded
ipfw -q delete set 29 2>/dev/null || true
sysctl net.inet.ip.fw.one_pass=1
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 up: delay=12ms,rate=1mbit,queue=10
ipfw -q pipe 32768 config bw 1Mbit/s delay 12 queue 10
ipfw -q add 50000 set 29 pipe 32768 tcp from 198.19.0.7 40000 to 198.18.0.1 80 in
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 down: delay=12ms,rate=6mbit,queue=30,loss=0.5%
ipfw -q pipe 32769 config bw 6Mbit/s delay 12 queue 30 plr 0.005
ipfw -q add 50000 set 29 pipe 32769 tcp from 198.18.0.1 80 to 198.19.0.7 40000 in
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 up: delay=3ms,rate=unlimited,queue=50
ipfw -q pipe 32770 config bw 0 delay 3 queue 50
ipfw -q add 50000 set 29 pipe 32770 tcp from 198.19.0.8 40001 to 198.18.0.1 443 in
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 down: delay=3ms,rate=100mbit,queue=40
ipfw -q pipe 32771 config bw 100Mbit/s delay 3 queue 40
ipfw -q add 50000 set 29 pipe 32771 tcp from 198.18.0.1 443 to 198.19.0.8 40001 in
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 up: delay=40ms,rate=512kbit,queue=5
ipfw -q pipe 32772 config bw 512Kbit/s delay 40 queue 5
ipfw -q add 50001 set 29 pipe 32772 ip from 198.19.1.0/24 to 198.18.0.1/32 in
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 down: delay=40ms,rate=2mbit,queue=30
ipfw -q pipe 32773 config bw 2Mbit/s delay 40 queue 30
ipfw -q add 50002 set 29 pipe 32773 ip from 198.18.0.1/32 to 198.19.1.0/24 in
# default up: delay=20ms,rate=10mbit,queue=50
ipfw -q pipe 32774 config bw 10Mbit/s delay 20 queue 50
ipfw -q add 59999 set 29 pipe 32774 ip from any to any in recv eth0
# default down: delay=20ms,rate=10mbit,queue=50,loss=1%
ipfw -q pipe 32775 config bw 10Mbit/s delay 20 queue 50 plr 0.01
ipfw -q add 59999 set 29 pipe 32775 ip from any to any in recv eth1
