#!/bin/sh -e
# mimic netemu render --backend dummynet: one dummynet pipe per mimic pipe, ipfw rules in table order
# dummynet counts IP bytes for bw, as mimic does; plr is not seeded
sysctl net.inet.ip.fw.one_pass=1
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 up: delay=12ms,rate=1mbit,queue=10
ipfw -q pipe 1 config bw 1Mbit/s delay 12 queue 10
ipfw -q add 1000 pipe 1 tcp from 198.19.0.7 40000 to 198.18.0.1 80 in
# flow #1 198.19.0.7:40000 -> 198.18.0.1:80 down: delay=12ms,rate=6mbit,queue=30,loss=0.5%
ipfw -q pipe 2 config bw 6Mbit/s delay 12 queue 30 plr 0.005
ipfw -q add 1001 pipe 2 tcp from 198.18.0.1 80 to 198.19.0.7 40000 in
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 up: delay=3ms,rate=unlimited,queue=50
ipfw -q pipe 3 config bw 0 delay 3 queue 50
ipfw -q add 1002 pipe 3 tcp from 198.19.0.8 40001 to 198.18.0.1 443 in
# flow #2 198.19.0.8:40001 -> 198.18.0.1:443 down: delay=3ms,rate=100mbit,queue=40
ipfw -q pipe 4 config bw 100Mbit/s delay 3 queue 40
ipfw -q add 1003 pipe 4 tcp from 198.18.0.1 443 to 198.19.0.8 40001 in
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 up: delay=40ms,rate=512kbit,queue=5
ipfw -q pipe 5 config bw 512Kbit/s delay 40 queue 5
ipfw -q add 1004 pipe 5 ip from 198.19.1.0/24 to 198.18.0.1/32 in
# prefix #1 198.19.1.0/24 -> 198.18.0.1/32 down: delay=40ms,rate=2mbit,queue=30
ipfw -q pipe 6 config bw 2Mbit/s delay 40 queue 30
ipfw -q add 1005 pipe 6 ip from 198.18.0.1/32 to 198.19.1.0/24 in
# default up: delay=20ms,rate=10mbit,queue=50
ipfw -q pipe 7 config bw 10Mbit/s delay 20 queue 50
ipfw -q add 1006 pipe 7 ip from any to any in recv eth0
# default down: delay=20ms,rate=10mbit,queue=50,loss=1%
ipfw -q pipe 8 config bw 10Mbit/s delay 20 queue 50 plr 0.01
ipfw -q add 1007 pipe 8 ip from any to any in recv eth1
