//! The over-free check of `BlockPool::free`: is any id listed more times
//! than its block has references?
//!
//! A pure function of the list and a count lookup, so that it can be tested
//! on its own, with counts that no pool would reach.

use crate::id::BlockId;

/// Lists up to this long are compared pairwise.
const PAIRWISE: usize = 16;
/// The bits of the screen: `index % SCREEN_BITS` picks one.
const SCREEN_BITS: usize = 64 * 64;
/// The indices one exact pass tallies.
const WINDOW: usize = 8 * 1024;
/// The indices one pass marks in a bitmap (the tally's bytes as bits).
const SPAN: usize = 8 * WINDOW;
/// The indices of one pass whose listings a wide count keeps once their
/// tally saturates.
const HEAVY: usize = 32;

/// The first id (in list order) listed more times than `count(id)`, its
/// number of references, if any. Every id must be in range for `count`,
/// and is assumed to have at least one reference (`BlockPool::free` checks
/// that first), so only a repeat can be over-freed.
///
/// Allocates nothing, and stays near linear for long lists:
/// - up to 16 ids are compared pairwise;
/// - a longer list is screened once through a filter of `index % 4096`
///   (512 bytes on the stack): if no two ids share a bit, none is listed
///   twice;
/// - otherwise it is checked exactly, a span of 65,536 consecutive indices
///   that holds a listed id at a time, in index order: one pass marks the
///   span's listed indices in a bitmap (8 KiB on the stack), and only a
///   window of 8,192 indices of the span where an index is listed twice
///   gets a pass that tallies each index of the window (the same 8 KiB):
///   an id whose tally passes its reference count is over-freed. A pass
///   stops at the earliest over-freed position found so far (no later one
///   can win). An index listed 255 times moves from its one-byte tally to
///   a wide count in a table of [`HEAVY`] (512 bytes on the stack); past
///   the table's room, it is deferred to further passes over the list,
///   which count the deferred indices exactly, [`HEAVY`] at a time.
///
/// That is O(n · spans) for `n` ids of distinct blocks (a pool of a
/// million blocks has at most 16 spans), plus a pass per window where a
/// block is listed twice (at most 8 a span), plus a pass per [`HEAVY`]
/// indices of a window listed 255 times or more beyond the first
/// [`HEAVY`]: at most `n / 8,160` passes, and none unless such a list
/// names more than 32 blocks 255 times each.
pub(super) fn first_over_freed(
    ids: &[BlockId],
    count: impl Fn(BlockId) -> usize,
) -> Option<BlockId> {
    let over = |i: usize, id: BlockId| {
        let listed = ids[..=i].iter().filter(|&&x| x == id).count();
        listed > count(id)
    };
    match ids {
        [] | [_] => None,
        [a, b] => (a == b && count(*a) < 2).then_some(*b),
        _ if ids.len() <= PAIRWISE => ids
            .iter()
            .enumerate()
            .find(|&(i, id)| ids[..i].contains(id) && over(i, *id))
            .map(|(_, &id)| id),
        _ => first_over_freed_long(ids, count),
    }
}

/// [`first_over_freed`] for a list longer than [`PAIRWISE`], out of line:
/// its 9 KiB of stack and its passes stay off the short lists' path.
#[inline(never)]
fn first_over_freed_long(ids: &[BlockId], count: impl Fn(BlockId) -> usize) -> Option<BlockId> {
    // Any two ids on the same bit of the screen?
    let mut screen = [0u64; SCREEN_BITS / 64];
    if !ids
        .iter()
        .any(|id| test_and_set(&mut screen, id.index() % SCREEN_BITS))
    {
        return None;
    }
    // Exactly, a span of `SPAN` indices at a time: `lo` is the lowest
    // listed index not yet covered, and `end` the earliest over-freed
    // position found so far (the list's length while there is none). A
    // pass marks the span's listed indices in a bitmap (the tally's bytes
    // as bits); only the windows of the span where an index is listed
    // twice are then tallied.
    let mut tally = [0u8; WINDOW];
    let mut heavy = [(0usize, 0usize); HEAVY];
    let mut end = ids.len();
    let mut lo = ids.iter().map(|id| id.index()).min()?;
    loop {
        tally.fill(0);
        let (mut next, mut repeats) = (usize::MAX, 0u8);
        for &id in &ids[..end] {
            let index = id.index();
            if index < lo {
                continue;
            }
            let offset = index - lo;
            if offset >= SPAN {
                next = next.min(index);
                continue;
            }
            let (byte, bit) = (offset / 8, 1u8 << (offset % 8));
            if tally[byte] & bit != 0 {
                repeats |= 1 << (offset / WINDOW);
            }
            tally[byte] |= bit;
        }
        for window in 0..SPAN / WINDOW {
            if repeats & (1 << window) != 0 {
                let at = lo + window * WINDOW;
                end = tally_window(&ids[..end], at, &mut tally, &mut heavy, &count);
            }
        }
        // Every listed index before `end` covered?
        if next == usize::MAX {
            return ids.get(end).copied();
        }
        lo = next;
    }
}

/// The exact pass over the window of indices `lo..lo + WINDOW`, with a
/// tally per index of it: returns the earliest position of `ids` whose id
/// in the window is listed more often so far than it has references, or
/// `ids.len()` if none is.
fn tally_window(
    ids: &[BlockId],
    lo: usize,
    tally: &mut [u8; WINDOW],
    heavy: &mut [(usize, usize); HEAVY],
    count: &impl Fn(BlockId) -> usize,
) -> usize {
    tally.fill(0);
    let mut end = ids.len();
    let (mut heavy_len, mut deferred) = (0, false);
    for (i, &id) in ids.iter().enumerate() {
        let index = id.index();
        if index < lo || index - lo >= WINDOW {
            continue;
        }
        let listed = &mut tally[index - lo];
        // How often listed so far: the tally up to 254; from the 255th
        // listing on, the wide count in `heavy`, or, the table full,
        // `None`: the index is deferred (its tally stays at 255).
        let so_far = if *listed < u8::MAX - 1 {
            *listed += 1;
            Some(usize::from(*listed))
        } else if *listed == u8::MAX - 1 {
            *listed = u8::MAX;
            if heavy_len < HEAVY {
                heavy[heavy_len] = (index, usize::from(u8::MAX));
                heavy_len += 1;
                Some(usize::from(u8::MAX))
            } else {
                deferred = true;
                None
            }
        } else {
            heavy[..heavy_len]
                .iter_mut()
                .find(|(x, _)| *x == index)
                .map(|(_, n)| {
                    *n += 1;
                    *n
                })
        };
        // Listed more often than referenced? (A repeat only: the first
        // listing was checked against zero references already.)
        if so_far.is_some_and(|n| n > 1 && n > count(id)) {
            end = i;
            break;
        }
    }
    if deferred {
        // The table's indices are done; the deferred ones (tally 255) are
        // counted from the list's start, `HEAVY` at a time.
        for &(index, _) in &heavy[..heavy_len] {
            tally[index - lo] = 0;
        }
        end = count_deferred(&ids[..end], lo, tally, heavy, count);
    }
    end
}

/// The passes of one window (indices `lo..lo + WINDOW`) over `ids` for
/// its deferred indices (those whose `tally` is 255): each pass counts
/// the listings of up to [`HEAVY`] of them, the first it meets, from the
/// list's start, and marks them done (tally 0). Returns the earliest
/// over-freed position among them, or `ids.len()` if none is.
fn count_deferred(
    ids: &[BlockId],
    lo: usize,
    tally: &mut [u8; WINDOW],
    heavy: &mut [(usize, usize); HEAVY],
    count: &impl Fn(BlockId) -> usize,
) -> usize {
    let mut end = ids.len();
    loop {
        let (mut heavy_len, mut more) = (0, false);
        for (i, &id) in ids[..end].iter().enumerate() {
            let index = id.index();
            if index < lo || index - lo >= WINDOW || tally[index - lo] != u8::MAX {
                continue;
            }
            let listed = match heavy[..heavy_len].iter_mut().find(|(x, _)| *x == index) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None if heavy_len < HEAVY => {
                    heavy[heavy_len] = (index, 1);
                    heavy_len += 1;
                    1
                }
                None => {
                    more = true;
                    continue;
                }
            };
            if listed > count(id) {
                end = i;
                break;
            }
        }
        for &(index, _) in &heavy[..heavy_len] {
            tally[index - lo] = 0;
        }
        if !more {
            return end;
        }
    }
}

/// Sets bit `bit` of `bits` and returns whether it was already set.
fn test_and_set(bits: &mut [u64], bit: usize) -> bool {
    let (word, mask) = (bit / 64, 1u64 << (bit % 64));
    let was = bits[word] & mask != 0;
    bits[word] |= mask;
    was
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    fn ids(indices: &[u32]) -> Vec<BlockId> {
        indices.iter().map(|&i| BlockId::new(i)).collect()
    }

    /// The definition: the first position whose id has been listed more
    /// often so far than it has references (counted in a map as the list
    /// is read).
    fn naive(ids: &[BlockId], count: impl Fn(BlockId) -> usize) -> Option<BlockId> {
        let mut listed = std::collections::HashMap::new();
        ids.iter().copied().find(|&id| {
            let n = listed.entry(id).or_insert(0usize);
            *n += 1;
            *n > count(id)
        })
    }

    #[test]
    fn a_short_list_is_compared_pairwise() {
        let list = ids(&[3, 1, 3, 1, 1]);
        // Two references each: the third 1 is the first over.
        assert_eq!(first_over_freed(&list, |_| 2), Some(BlockId::new(1)));
        assert_eq!(first_over_freed(&list, |_| 3), None);
        // With one reference each, the second 3 comes first.
        assert_eq!(first_over_freed(&list, |_| 1), Some(BlockId::new(3)));
    }

    #[test]
    fn lists_of_up_to_two_ids_match_the_naive_count() {
        for list in [vec![], vec![4], vec![4, 5], vec![5, 4], vec![4, 4]] {
            let list = ids(&list);
            for refs in 1..=3 {
                let count = |_| refs;
                assert_eq!(
                    first_over_freed(&list, count),
                    naive(&list, count),
                    "{list:?} with {refs} references each"
                );
            }
        }
        assert_eq!(
            first_over_freed(&ids(&[4, 4]), |_| 1),
            Some(BlockId::new(4))
        );
    }

    #[test]
    fn distinct_ids_pass_the_screen() {
        let list: Vec<BlockId> = (0..5000).map(BlockId::new).collect();
        assert_eq!(first_over_freed(&list, |_| 1), None);
    }

    #[test]
    fn ids_at_the_top_of_the_id_range_are_screened_and_checked() {
        // Indices far past the screen's 4096 bits: the screen wraps them.
        let top = u32::MAX - 1;
        let mut list: Vec<BlockId> = (0..20).map(|i| BlockId::new(top - 2 * i)).collect();
        assert_eq!(first_over_freed(&list, |_| 1), None);
        list.push(BlockId::new(top - 4));
        assert_eq!(first_over_freed(&list, |_| 1), Some(BlockId::new(top - 4)));
        assert_eq!(first_over_freed(&list, |_| 2), None);
    }

    #[test]
    fn ids_sharing_a_screen_bit_are_checked_exactly() {
        // 7 and 7 + 4096 share a bit of the screen but are different ids.
        let mut list: Vec<BlockId> = (100..120).map(BlockId::new).collect();
        list.extend(ids(&[7, 7 + 4096]));
        assert_eq!(first_over_freed(&list, |_| 1), None);
        list.push(BlockId::new(7));
        assert_eq!(first_over_freed(&list, |_| 1), Some(BlockId::new(7)));
        assert_eq!(first_over_freed(&list, |_| 2), None);
    }

    #[test]
    fn the_earliest_position_wins_across_windows() {
        // A repeat in a high window comes before one in a low window.
        let far = 3 * 8 * 1024 + 5;
        let mut list: Vec<BlockId> = (0..20).map(BlockId::new).collect();
        list.extend(ids(&[far, far, 2]));
        assert_eq!(first_over_freed(&list, |_| 1), Some(BlockId::new(far)));
        assert_eq!(naive(&list, |_| 1), Some(BlockId::new(far)));
    }

    #[test]
    fn an_id_listed_past_its_saturated_tally_is_counted() {
        // 300 listings of one id: the tally saturates at 255.
        let mut list: Vec<BlockId> = (0..20).map(BlockId::new).collect();
        list.extend(std::iter::repeat(BlockId::new(9)).take(300));
        assert_eq!(
            first_over_freed(&list, |id| if id.index() == 9 { 301 } else { 1 }),
            None
        );
        assert_eq!(
            first_over_freed(&list, |id| if id.index() == 9 { 280 } else { 1 }),
            Some(BlockId::new(9))
        );
    }

    #[test]
    fn a_long_run_of_one_id_is_counted_in_one_pass() {
        // Four million listings of one id: one pass, no count over the
        // list so far (which would take about 8 * 10^12 comparisons).
        let n = 1 << 22;
        let list = vec![BlockId::new(5); n];
        assert_eq!(first_over_freed(&list, |_| n), None);
        assert_eq!(first_over_freed(&list, |_| n - 1), Some(BlockId::new(5)));
        let mut both = list.clone();
        both.insert(n / 2, BlockId::new(6));
        both.push(BlockId::new(6));
        assert_eq!(
            first_over_freed(&both, |id| if id.index() == 6 { 1 } else { n }),
            Some(BlockId::new(6))
        );
    }

    #[test]
    fn more_heavy_ids_than_the_table_holds_agree_with_the_definition() {
        // 40 ids of one window, each listed 300 times, interleaved: the
        // table keeps 32 of them, the rest are counted the slow way.
        let list: Vec<BlockId> = (0..300)
            .flat_map(|_| (0..40).map(|i| BlockId::new(100 + i)))
            .collect();
        for refs in [299, 300] {
            for over in [None, Some(37), Some(3)] {
                let count = |id: BlockId| match over {
                    Some(o) if id.index() == 100 + o => refs - 1,
                    _ => refs,
                };
                assert_eq!(
                    first_over_freed(&list, count),
                    naive(&list, count),
                    "refs {refs}, over {over:?}"
                );
            }
        }
    }

    #[test]
    fn a_deferred_id_at_its_windows_first_index_is_counted() {
        // 40 ids listed 300 times each, highest first: the table keeps the
        // 32 highest, and the lowest listed index (the window's first)
        // is among the 8 deferred.
        let list: Vec<BlockId> = (0..300)
            .flat_map(|_| (0..40).rev().map(|i| BlockId::new(100 + i)))
            .collect();
        for over in [100, 107, 108] {
            let count = |id: BlockId| if id.index() == over { 299 } else { 300 };
            assert_eq!(
                first_over_freed(&list, count),
                Some(BlockId::new(over as u32)),
                "over {over}"
            );
            assert_eq!(naive(&list, count), Some(BlockId::new(over as u32)));
        }
    }

    #[test]
    fn heavy_ids_past_several_deferred_passes_agree_with_the_definition() {
        // 100 ids of one window, each listed 260 times, interleaved in two
        // orders: 32 go to the table, 68 to three deferred passes.
        let round: Vec<u32> = (0..100).map(|i| 200 + (i * 37) % 100).collect();
        let list: Vec<BlockId> = (0..260)
            .flat_map(|r| {
                let mut ids = round.clone();
                if r % 2 == 1 {
                    ids.reverse();
                }
                ids.into_iter().map(BlockId::new)
            })
            .collect();
        for refs in [255, 259, 260] {
            for over in [None, Some(299), Some(250), Some(200)] {
                let count = |id: BlockId| match over {
                    Some(o) if id.index() == o => refs - 1,
                    _ => refs,
                };
                assert_eq!(
                    first_over_freed(&list, count),
                    naive(&list, count),
                    "refs {refs}, over {over:?}"
                );
            }
        }
        // Two windows, each with deferred ids, the earlier position in
        // the second window.
        let far = 5 * 8 * 1024;
        let two: Vec<BlockId> = (0..300)
            .flat_map(|_| (0..40).flat_map(|i| [BlockId::new(i), BlockId::new(far + i)]))
            .collect();
        let count = |id: BlockId| {
            if id.index() == far as usize + 39 {
                280
            } else {
                300
            }
        };
        assert_eq!(first_over_freed(&two, count), Some(BlockId::new(far + 39)));
        assert_eq!(naive(&two, count), Some(BlockId::new(far + 39)));
    }

    #[test]
    fn agrees_with_the_definition() {
        // A small deterministic generator: lists of 0..64 ids (one in
        // eight of 0..3000) over a range of indices that makes repeats
        // likely, and several windows and spans.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..2000 {
            let len = (next() % if round % 8 == 0 { 3000 } else { 64 }) as usize;
            let spread = [8, 40, 5000, 40_000, 300_000, 3_000_000][(next() % 6) as usize];
            let list: Vec<BlockId> = (0..len)
                .map(|_| BlockId::new((next() % spread) as u32))
                .collect();
            let refs = 1 + (next() % 3) as usize;
            let count = |id: BlockId| refs + id.index() % 2;
            assert_eq!(
                first_over_freed(&list, count),
                naive(&list, count),
                "{list:?}"
            );
        }
    }

    #[test]
    fn repeats_in_several_windows_of_spans_keep_the_earliest() {
        // Distinct ids over three spans, then repeats in windows 7 and 2
        // of the second span and window 0 of the third, in that order.
        let span = SPAN as u32;
        let mut list: Vec<BlockId> = (0..3 * span).step_by(97).map(BlockId::new).collect();
        let (a, b, c) = (span + 7 * 8192 + 5, span + 2 * 8192 + 1, 2 * span + 3);
        list.extend(ids(&[a, b, c]));
        list.extend(ids(&[a, b, c]));
        list.extend(ids(&[a, b, c]));
        for refs in 1..=3 {
            assert_eq!(
                first_over_freed(&list, |_| refs),
                naive(&list, |_| refs),
                "refs {refs}"
            );
        }
        let distinct: Vec<BlockId> = (0..4 * span).step_by(3).map(BlockId::new).collect();
        assert_eq!(first_over_freed(&distinct, |_| 1), None);
    }
}
