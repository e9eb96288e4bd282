#![no_main]
//! cargo fuzz run analyzer (see fuzz/README.md)
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mimic_analyze::fuzzing::analyze_frames(data);
});
