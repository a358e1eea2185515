//! Build script of the command: the probes of `tools/npm/build_probe.rs` (which tests can run
//! here), and two options of the release link of `toolloop` that make it smaller (README,
//! "Building and installing"), given where they are known to hold: a native build for
//! `x86_64-unknown-linux-gnu`, linked by Rust's own `lld` (the default since Rust 1.90), with
//! no linker of the user's choosing.
//!
//! - `--icf=safe`: functions with identical machine code are kept once, unless their address
//!   is taken where it may be compared (the compilers' address-significance tables say where;
//!   code without such a table, such as SQLite's C, is left as it is). Only with Rust 1.90 or
//!   later, whose `lld` is the default linker of this target: the system's `ld` has no such
//!   option.
//! - `-z pack-relative-relocs` (RELR): the position-independent program's relocations, about
//!   1.8 MB as plain entries, are packed as bitmaps. Only when the system's C library reads them
//!   (glibc 2.36 and later define `GLIBC_ABI_DT_RELR`, which the program then requires): the
//!   build's C library is the one the installed command runs with.

#[path = "../../tools/npm/build_probe.rs"]
mod probe;

use std::env::{var, var_os};

fn main() {
    probe::probe();
    release_link();
}

fn release_link() {
    println!("cargo::rerun-if-changed=build.rs");
    let target = var("TARGET").unwrap_or_default();
    let native_linux = target == "x86_64-unknown-linux-gnu" && var("HOST").ok() == Some(target);
    // A linker (or linker flavour) of the user's own: its options are not ours to guess.
    let own_linker = var_os("RUSTC_LINKER").is_some()
        || var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("link"));
    if var("PROFILE").as_deref() != Ok("release") || !native_linux || own_linker {
        return;
    }
    if rustc_links_with_lld() {
        println!("cargo::rustc-link-arg-bin=toolloop=-Wl,--icf=safe");
    }
    if glibc_reads_relr() {
        println!("cargo::rustc-link-arg-bin=toolloop=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the system's C library defines the `GLIBC_ABI_DT_RELR` version (glibc 2.36 and later).
fn glibc_reads_relr() -> bool {
    const LIBCS: [&str; 4] = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
        "/usr/lib64/libc.so.6",
    ];
    let Some(libc) = LIBCS.iter().find_map(|p| std::fs::read(p).ok()) else {
        return false;
    };
    libc.windows(b"GLIBC_ABI_DT_RELR\0".len())
        .any(|w| w == b"GLIBC_ABI_DT_RELR\0")
}

/// Whether the compiler is Rust 1.90 or later, which links this target with its own `lld`.
fn rustc_links_with_lld() -> bool {
    let rustc = var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(out) = std::process::Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (…)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut numbers = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
