//! `analyze_file TRACE OUT.db [THREADS]`: runs the analysis driver without the CLI (for
//! profiling the library on its own).
#[global_allocator]
static GLOBAL: mimic_analyze::alloc::Allocator = mimic_analyze::alloc::Allocator;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let threads = a.get(3).and_then(|t| t.parse().ok()).unwrap_or(1);
    let opts = mimic_analyze::driver::RunOptions {
        inputs: vec![a[1].clone().into()],
        output: a[2].clone().into(),
        config: mimic_analyze::Config::default(),
        threads,
        progress: None,
        meta: Vec::new(),
        filter: None,
        cancel: None,
    };
    match mimic_analyze::driver::run(&opts) {
        Ok(s) => println!(
            "{} frames, {} connections, {:.3} s, {:.2} M frames/s",
            s.frames,
            s.connections,
            s.elapsed_s,
            s.frames_per_s / 1e6
        ),
        Err(e) => eprintln!("error: {e}"),
    }
}
