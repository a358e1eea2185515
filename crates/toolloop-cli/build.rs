//! Build script of the command: the probes of `tools/npm/build_probe.rs` (which tests can run
//! here), and two options of the release link of `toolloop` that make it smaller (README,
//! "Building and installing"), given where they are known to hold: a native build for
//! `x86_64-unknown-linux-gnu`, linked by Rust's own `lld` (the default since Rust 1.90), with
//! no linker of the user's choosing.
//!
//! - `--icf=all`: functions with identical machine code are kept once. Rust promises no
//!   function (or vtable) a unique address, and rustc already merges identical functions itself.
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
    println!("cargo::rustc-link-arg-bin=toolloop=-Wl,--icf=all");
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
