#!/bin/sh -e
# mimic netemu render --backend dummynet: one dummynet pipe per mimic pipe, ipfw rules in table order
# NOTE: 12 pipes' delays rounded to whole milliseconds (dummynet's resolution)
# WARNING: 3 pipes rendered WITHOUT their ACK policy (delayed-ACK shaping needs mimic's datapath)
# mimic's rules are in set 29 (flows 50000, prefixes from 50001, default 59999), its pipes numbered from 32768; re-applying replaces them
# dummynet counts IP bytes for bw, as mimic does; plr is not seeded
ipfw -q delete set 29 2>/dev/null || true
sysctl net.inet.ip.fw.one_pass=1
# flow #1 198.19.0.1:20000 -> 198.18.0.1:80 up: delay=10572us,rate=unlimited,queue=40,seed=11400714819323198484
ipfw -q pipe 32768 config bw 0 delay 11 queue 40
ipfw -q add 50000 set 29 pipe 32768 tcp from 198.19.0.1 20000 to 198.18.0.1 80 in
# flow #1 198.19.0.1:20000 -> 198.18.0.1:80 down: delay=10572us,rate=6944039bit,queue=40,loss=0.136249%,seed=11400714817801786753
ipfw -q pipe 32769 config bw 6944039bit/s delay 11 queue 40 plr 0.001362
ipfw -q add 50000 set 29 pipe 32769 tcp from 198.18.0.1 80 to 198.19.0.1 20000 in
# flow #2 198.19.0.2:20000 -> 198.18.0.1:80 up: delay=1213us,rate=unlimited,queue=40,seed=11400714819323198487,ack_every=2,ack_timeout=200ms
ipfw -q pipe 32770 config bw 0 delay 1 queue 40
ipfw -q add 50000 set 29 pipe 32770 tcp from 198.19.0.2 20000 to 198.18.0.1 80 in
# flow #2 198.19.0.2:20000 -> 198.18.0.1:80 down: delay=1213us,rate=245528220bit,queue=40,loss=0.012352%,seed=11400714817801786754
ipfw -q pipe 32771 config bw 245528220bit/s delay 1 queue 40 plr 0.000124
ipfw -q add 50000 set 29 pipe 32771 tcp from 198.18.0.1 80 to 198.19.0.2 20000 in
# flow #3 198.19.0.3:20000 -> 198.18.0.1:80 up: delay=36127us,rate=unlimited,queue=10,seed=11400714819323198486,ack_every=2,ack_timeout=200ms
ipfw -q pipe 32772 config bw 0 delay 36 queue 10
ipfw -q add 50000 set 29 pipe 32772 tcp from 198.19.0.3 20000 to 198.18.0.1 80 in
# flow #3 198.19.0.3:20000 -> 198.18.0.1:80 down: delay=36127us,rate=5821371bit,queue=30,loss=0.922147%,seed=11400714817801786755
ipfw -q pipe 32773 config bw 5821371bit/s delay 36 queue 30 plr 0.009221
ipfw -q add 50000 set 29 pipe 32773 tcp from 198.18.0.1 80 to 198.19.0.3 20000 in
# flow #4 198.19.0.4:20000 -> 198.18.0.1:80 up: delay=1039us,rate=unlimited,queue=40,seed=11400714819323198481
ipfw -q pipe 32774 config bw 0 delay 1 queue 40
ipfw -q add 50000 set 29 pipe 32774 tcp from 198.19.0.4 20000 to 198.18.0.1 80 in
# flow #4 198.19.0.4:20000 -> 198.18.0.1:80 down: delay=1039us,rate=75675088bit,queue=40,loss=0.037936%,seed=11400714817801786756
ipfw -q pipe 32775 config bw 75675088bit/s delay 1 queue 40 plr 0.000379
ipfw -q add 50000 set 29 pipe 32775 tcp from 198.18.0.1 80 to 198.19.0.4 20000 in
# flow #5 198.19.0.5:20000 -> 198.18.0.1:80 up: delay=38322us,rate=unlimited,queue=10,seed=11400714819323198480,ack_every=2,ack_timeout=200ms
ipfw -q pipe 32776 config bw 0 delay 38 queue 10
ipfw -q add 50000 set 29 pipe 32776 tcp from 198.19.0.5 20000 to 198.18.0.1 80 in
# flow #5 198.19.0.5:20000 -> 198.18.0.1:80 down: delay=38322us,rate=4958369bit,queue=30,loss=0.749289%,seed=11400714817801786757
ipfw -q pipe 32777 config bw 4958369bit/s delay 38 queue 30 plr 0.007493
ipfw -q add 50000 set 29 pipe 32777 tcp from 198.18.0.1 80 to 198.19.0.5 20000 in
# flow #6 198.19.0.6:20000 -> 198.18.0.1:80 up: delay=3487us,rate=unlimited,queue=40,seed=11400714819323198483
ipfw -q pipe 32778 config bw 0 delay 3 queue 40
ipfw -q add 50000 set 29 pipe 32778 tcp from 198.19.0.6 20000 to 198.18.0.1 80 in
# flow #6 198.19.0.6:20000 -> 198.18.0.1:80 down: delay=3487us,rate=145785586bit,queue=40,loss=0.052497%,seed=11400714817801786758
ipfw -q pipe 32779 config bw 145785586bit/s delay 3 queue 40 plr 0.000525
ipfw -q add 50000 set 29 pipe 32779 tcp from 198.18.0.1 80 to 198.19.0.6 20000 in
