//! Byte-for-byte snapshots of what the server answers (discovery, OpenAPI, Tables, errors), kept in
//! `tests/fixtures/golden/`, so a refactoring of how these are built cannot change them unnoticed.
//! `UPDATE_GOLDEN=1 cargo test --lib golden` writes them anew; review the diff before committing it.

use std::path::PathBuf;

pub(crate) fn check(name: &str, actual: &[u8]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    if want != actual {
        panic!(
            "{name} differs from {}:\n want: {}\n  got: {}",
            path.display(),
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(actual)
        );
    }
}
