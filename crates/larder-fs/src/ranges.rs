//! Byte ranges of a file: sorted, disjoint lists of them (dirty ranges, what a push sent), and the
//! blocks they fall in. A leaf: the namespace, the data path and the pipeline all use it.

use std::ops::Range;

/// Insert `r` into a sorted list of disjoint ranges, merging neighbours.
pub(crate) fn add_range(ranges: &mut Vec<Range<u64>>, r: Range<u64>) {
    if r.is_empty() {
        return;
    }
    ranges.push(r);
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    *ranges = merged;
}

/// Whether the sorted, merged `ranges` cover all `size` bytes of a file: a push of them sends its whole
/// content.
pub(crate) fn whole(ranges: &[Range<u64>], size: u64) -> bool {
    size > 0 && ranges.first().is_some_and(|r| r.start == 0 && r.end >= size)
}

/// The parts of the sorted, disjoint `ranges` that no range of the sorted, disjoint `minus` covers.
pub(crate) fn subtract(ranges: &[Range<u64>], minus: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for r in ranges {
        let mut start = r.start;
        for m in minus.iter().filter(|m| m.end > r.start && m.start < r.end) {
            if m.start > start {
                out.push(start..m.start);
            }
            start = start.max(m.end);
        }
        if start < r.end {
            out.push(start..r.end);
        }
    }
    out
}

/// The bytes of block `index` of a file of `size` bytes, in blocks of `bs` (the last one may be short).
pub(crate) fn bytes_of(index: u32, bs: u64, size: u64) -> Range<u64> {
    index as u64 * bs..((index as u64 + 1) * bs).min(size)
}

pub(crate) fn blocks_of(r: &Range<u64>, bs: u64) -> Range<u32> {
    if r.is_empty() {
        return 0..0;
    }
    (r.start / bs) as u32..((r.end - 1) / bs) as u32 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        let mut v = Vec::new();
        add_range(&mut v, 10..20);
        add_range(&mut v, 30..40);
        add_range(&mut v, 20..30);
        add_range(&mut v, 0..5);
        assert_eq!(v, vec![0..5, 10..40]);
        assert_eq!(blocks_of(&(4095..4097), 4096), 0..2);
        assert_eq!(blocks_of(&(0..4096), 4096), 0..1);
        assert_eq!(
            subtract(&[0..10, 20..30], &[5..8, 9..22, 29..40]),
            vec![0..5, 8..9, 22..29]
        );
        let whole = std::slice::from_ref(&(0..10u64));
        assert_eq!(subtract(whole, &[]), whole.to_vec());
        assert_eq!(subtract(whole, whole), Vec::<Range<u64>>::new());
    }
}
