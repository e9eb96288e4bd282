//! `analyze_nodb TRACE`: reads, decodes and analyzes a trace, dropping the records (to
//! measure the analyzer without the database).
use mimic_core::trace::TraceReader;

#[global_allocator]
static GLOBAL: mimic_analyze::alloc::Allocator = mimic_analyze::alloc::Allocator;

fn main() {
    let path = std::env::args().nth(1).expect("TRACE");
    let mut r = TraceReader::open(&path).expect("open");
    let mut an = mimic_analyze::Analyzer::new(mimic_analyze::Config::default());
    let mut no = 0u64;
    let mut recs = 0u64;
    let mut ex = 0u64;
    let t0 = std::time::Instant::now();
    while let Ok(Some(f)) = r.next_frame() {
        no += 1;
        let _ = an.handle_frame(no, f.ts, f.link, f.data);
        while let Some(rec) = an.poll_record() {
            recs += 1;
            ex += rec.exchanges.len() as u64;
        }
    }
    an.finish();
    while let Some(rec) = an.poll_record() {
        recs += 1;
        ex += rec.exchanges.len() as u64;
    }
    println!(
        "{no} frames, {recs} records, {ex} exchanges, {:.3} s",
        t0.elapsed().as_secs_f64()
    );
}
