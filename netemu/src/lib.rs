//! Per-flow network emulation: the pipe engine, the userspace datapath, tc/ipfw backends and the three-host lab
