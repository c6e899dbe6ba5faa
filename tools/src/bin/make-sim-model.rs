//! Writes the simulator models' folder: `make-sim-model [OUT_DIR]` (default
//! `examples/models/sim-small`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| turnpike_tools::workspace_root().join("examples/models/sim-small"));
    match turnpike_tools::write_sim_model(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)] // a tool's one line of failure
            {
                eprintln!("make-sim-model: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
