#![no_main]
//! cargo fuzz run frame (see fuzz/README.md)
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mimic_analyze::fuzzing::decode_frame(data);
});
