//! With the `python` feature: PyO3's interpreter cfgs (`Py_3_12`, `Py_LIMITED_API`,
//! `Py_GIL_DISABLED`, ...), and `fast_ints` where `bindings::int_reader` and
//! `bindings::bytes_reader` may read CPython's `int` and `bytes` objects in place: a
//! 64-bit, version-specific CPython build with the GIL. Without the feature (the
//! pyo3-free core, `cargo test`, `cargo bench`) it does nothing.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(fast_ints)");
    #[cfg(feature = "python")]
    python_cfgs();
}

#[cfg(feature = "python")]
fn python_cfgs() {
    pyo3_build_config::use_pyo3_cfgs();
    let outputs = pyo3_build_config::get().build_script_outputs();
    let layout_hidden_or_unknown = [
        "Py_LIMITED_API",
        "Py_GIL_DISABLED",
        "PyPy",
        "GraalPy",
        "RustPython",
    ]
    .iter()
    .any(|cfg| {
        outputs
            .iter()
            .any(|line| line == &format!("cargo:rustc-cfg={cfg}"))
    });
    let abi3 = std::env::var_os("CARGO_FEATURE_ABI3").is_some();
    let wide = std::env::var("CARGO_CFG_TARGET_POINTER_WIDTH").as_deref() == Ok("64");
    if wide && !abi3 && !layout_hidden_or_unknown {
        println!("cargo:rustc-cfg=fast_ints");
    }
}
