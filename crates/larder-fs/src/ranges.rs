//! Byte ranges of a file: sorted, disjoint lists of them (dirty ranges, what a push sent), and the
//! blocks they fall in. A leaf: the namespace, the data path and the pipeline all use it.

use std::ops::Range;

/// Insert `r` into a sorted list of disjoint ranges, merging neighbours. Only the ranges `r` touches move:
/// a file written in many small pieces with gaps between (hundreds of thousands of ranges) pays a binary
/// search per write, not a sort of them all.
pub(crate) fn add_range(ranges: &mut Vec<Range<u64>>, r: Range<u64>) {
    if r.is_empty() {
        return;
    }
    // The first range that ends at or after `r` starts, and the first that starts after `r` ends: those
    // between them touch `r` and merge with it.
    let first = ranges.partition_point(|x| x.end < r.start);
    let last = ranges.partition_point(|x| x.start <= r.end);
    if first == last {
        ranges.insert(first, r);
        return;
    }
    let merged = ranges[first].start.min(r.start)..ranges[last - 1].end.max(r.end);
    ranges[first] = merged;
    ranges.drain(first + 1..last);
}

/// Whether the sorted, merged `ranges` cover all `size` bytes of a file: a push of them sends its whole
/// content.
pub(crate) fn whole(ranges: &[Range<u64>], size: u64) -> bool {
    size > 0 && ranges.first().is_some_and(|r| r.start == 0 && r.end >= size)
}

/// The parts of the sorted, disjoint `ranges` that no range of the sorted, disjoint `minus` covers. One
/// pass over both.
pub(crate) fn subtract(ranges: &[Range<u64>], minus: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut m = 0;
    for r in ranges {
        // Ranges of `minus` wholly before this one are before every later one too.
        while m < minus.len() && minus[m].end <= r.start {
            m += 1;
        }
        let mut start = r.start;
        let mut k = m;
        while k < minus.len() && minus[k].start < r.end {
            if minus[k].start > start {
                out.push(start..minus[k].start);
            }
            start = start.max(minus[k].end);
            k += 1;
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

/// The blocks the sorted, disjoint `ranges` fall in, in blocks of `bs`: each once, in order, however many
/// ranges share a block.
pub(crate) fn blocks_in(ranges: &[Range<u64>], bs: u64) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for r in ranges {
        for b in blocks_of(r, bs) {
            if out.last().is_none_or(|&last| last < b) {
                out.push(b);
            }
        }
    }
    out
}

/// The blocks the sorted, disjoint `ranges` fall in, as runs of consecutive blocks: each block once.
pub(crate) fn block_runs(ranges: &[Range<u64>], bs: u64) -> Vec<Range<u32>> {
    let mut out: Vec<Range<u32>> = Vec::new();
    for b in ranges.iter().map(|r| blocks_of(r, bs)).filter(|b| !b.is_empty()) {
        match out.last_mut() {
            Some(last) if b.start <= last.end => last.end = last.end.max(b.end),
            _ => out.push(b),
        }
    }
    out
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

    /// `add_range` and `subtract` against a byte map of the same file, for many random ranges.
    #[test]
    fn ranges_agree_with_a_map_of_the_bytes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let (mut v, mut minus) = (Vec::new(), Vec::new());
            let (mut bytes, mut minus_bytes) = ([false; 256], [false; 256]);
            for _ in 0..next(20) {
                let (a, b) = (next(256), next(256));
                let r = a.min(b)..a.max(b);
                bytes[r.start as usize..r.end as usize].fill(true);
                add_range(&mut v, r);
                let (a, b) = (next(256), next(256));
                let m = a.min(b)..a.max(b);
                minus_bytes[m.start as usize..m.end as usize].fill(true);
                add_range(&mut minus, m);
            }
            let as_ranges = |f: &dyn Fn(usize) -> bool| {
                let mut out: Vec<Range<u64>> = Vec::new();
                for i in (0..256).filter(|&i| f(i)) {
                    match out.last_mut() {
                        Some(last) if last.end == i as u64 => last.end += 1,
                        _ => out.push(i as u64..i as u64 + 1),
                    }
                }
                out
            };
            assert_eq!(v, as_ranges(&|i| bytes[i]));
            assert_eq!(subtract(&v, &minus), as_ranges(&|i| bytes[i] && !minus_bytes[i]));
            let blocks: Vec<u32> = (0..256u32 / 16)
                .filter(|b| (0..16).any(|i| bytes[(b * 16 + i) as usize]))
                .collect();
            assert_eq!(blocks_in(&v, 16), blocks);
            assert_eq!(block_runs(&v, 16).into_iter().flatten().collect::<Vec<_>>(), blocks);
        }
    }
}
