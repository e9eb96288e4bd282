#![no_main]
//! cargo fuzz run trace (see fuzz/README.md)
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mimic_analyze::fuzzing::analyze_trace(data);
});
