//! Run-time switches: the environment variables densebench's knobs are read from, and
//! thread-local overrides of them (a test sets one on its thread without touching the
//! process's environment).

use std::cell::Cell;

/// The value of the environment variable `name`, `None` where it is unset; a value that is
/// not Unicode is read lossily, so that the switch reading it refuses it by what it shows
/// rather than taking it for unset.
pub(crate) fn env_value(name: &str) -> Option<String> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => None,
        Ok(v) => Some(v),
        Err(std::env::VarError::NotUnicode(v)) => Some(v.to_string_lossy().into_owned()),
    }
}

/// Runs `f` with the thread-local `key` set to `value`, restoring the old value afterwards,
/// also when `f` panics.
pub(crate) fn scoped<T: Copy + 'static, R>(
    key: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(key, key.with(|c| c.replace(value)));
    f()
}
