//! Monkey Do: client emulator, server emulator, replay orchestration and synthetic workloads
