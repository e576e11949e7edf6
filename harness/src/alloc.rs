//! PLACEHOLDER (being written): counting global allocator.
use std::alloc::{GlobalAlloc, Layout, System};
pub struct Counting;
impl Counting {
    pub const fn new() -> Self {
        Counting
    }
}
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
