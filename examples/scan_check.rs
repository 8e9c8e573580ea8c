//! How long the check of a body passed on takes (`Shape::checked`: the
//! root's members read, every value skipped), or the scanner's building of
//! its whole value (`value`): the best of 7 runs of 3,000. The same body
//! again, as a coding agent's requests of one session come: the tool lists
//! and long strings with escapes a thread read before are passed over
//! (`front/known_tools.rs`, `json/seen.rs`), as they are in the proxy.
//!
//! ```sh
//! cargo run --release --example scan_check -- BODY.json [value]
//! ```
//!
//! One process, no network: steadier than a request's CPU time, which
//! swings by more than a few percent between runs on a shared machine.

use std::hint::black_box;
use std::time::Instant;

use agent_proxy::front::budget::Shape;
use agent_proxy::json::scan::Scanner;

/// The proxy's own allocator: a built value is mostly allocations.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: scan_check BODY.json [value]")?;
    let build = args.next().as_deref() == Some("value");
    let body = std::fs::read(path)?;
    let text = std::str::from_utf8(&body)?;
    let runs = 3000;
    let mut best = f64::MAX;
    for _ in 0..7 {
        let started = Instant::now();
        for _ in 0..runs {
            let ok = match build {
                true => black_box(Scanner::new(black_box(text)).parse_value()).is_ok(),
                false => black_box(Shape::checked(black_box(&body))).is_some(),
            };
            if !ok {
                return Err("not JSON".into());
            }
        }
        best = best.min(started.elapsed().as_nanos() as f64 / f64::from(runs));
    }
    let what = if build { "build of its value" } else { "check" };
    println!("{best:.0} ns a {what} ({} bytes)", body.len());
    Ok(())
}
