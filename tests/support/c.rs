//! Compiling C fixtures with the `cc` crate (outside a build script: target, host and output
//! directory are given explicitly).

use std::path::{Path, PathBuf};
use std::process::Command;

fn compiler() -> Command {
    let tool = cc::Build::new()
        .cargo_metadata(false)
        .target(env!("TURNPIKE_TEST_TARGET"))
        .host(env!("TURNPIKE_TEST_HOST"))
        .opt_level(1)
        .debug(false)
        .get_compiler();
    let mut cmd = tool.to_command();
    cmd.args([
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-pthread",
    ]);
    cmd
}

fn output_dir() -> PathBuf {
    let dir = super::profile_dir().join("c-fixtures");
    std::fs::create_dir_all(&dir).expect("create c-fixtures dir");
    dir
}

/// Runs `cmd` writing to a temporary name, then renames to `out`: tests in parallel processes
/// may build the same fixture at once.
fn build(mut cmd: Command, out: &Path) -> PathBuf {
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    cmd.arg("-o").arg(&tmp);
    let result = cmd.output().expect("run the C compiler");
    let args: Vec<_> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert!(
        result.status.success(),
        "C compile failed: {} {}\n{}",
        cmd.get_program().to_string_lossy(),
        args.join(" "),
        String::from_utf8_lossy(&result.stderr)
    );
    std::fs::rename(&tmp, out).expect("move the fixture into place");
    out.to_path_buf()
}

/// Builds `lib<name>.so` from `sources` against headers in `include`, with `-D` defines.
pub fn shared_library(
    name: &str,
    sources: &[PathBuf],
    include: &Path,
    defines: &[&str],
) -> PathBuf {
    let file = format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let mut cmd = compiler();
    cmd.args(["-shared", "-fPIC", "-fvisibility=hidden"])
        .arg("-I")
        .arg(include);
    cmd.args(defines.iter().map(|d| format!("-D{d}")));
    cmd.args(sources);
    build(cmd, &output_dir().join(file))
}

/// Builds an executable from `sources` against headers in `include`.
pub fn program(name: &str, sources: &[PathBuf], include: &Path, libs: &[&str]) -> PathBuf {
    let mut cmd = compiler();
    cmd.arg("-I").arg(include).args(sources);
    cmd.args(libs.iter().map(|l| format!("-l{l}")));
    build(
        cmd,
        &output_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX)),
    )
}

/// Compiles `source` as C++ (checks a header is usable from C++); returns the object file.
pub fn cxx_object(name: &str, source: &Path, include: &Path) -> PathBuf {
    let tool = cc::Build::new()
        .cargo_metadata(false)
        .cpp(true)
        .target(env!("TURNPIKE_TEST_TARGET"))
        .host(env!("TURNPIKE_TEST_HOST"))
        .opt_level(0)
        .get_compiler();
    let mut cmd = tool.to_command();
    cmd.args([
        "-std=c++11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-c",
    ])
    .arg("-I")
    .arg(include)
    .arg(source);
    build(cmd, &output_dir().join(format!("{name}.o")))
}
