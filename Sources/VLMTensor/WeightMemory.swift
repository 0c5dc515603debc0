#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
internal import Foundation

/// Memory for a weight in the form its layer multiplies (packed for oneDNN, or in 16-row groups for the decoding
/// products), or for a buffer in such a layout; give it back with `releaseWeightMemory`. Decoding reads every weight
/// once per token, a new 4 KiB page every few microseconds per stream, so weights lie on transparent huge pages
/// (Linux) and a step takes far fewer TLB misses: from 2 MiB on a block of its own starting on a huge-page boundary;
/// smaller weights of a model (`sideBySide`) one after another in shared slabs of huge pages, so that a small
/// model's matrices (SmolLM2-135M's are 0.25–1.3 MB) sit in the order its step reads them. `vlm bench` of SmolLM2-135M
/// Q4_1 on a Zen 4 VM, alternated with small pages for those: 1.045× (six pairs); a C harness of Qwen2-0.5B Q4_K_M's
/// larger matrices, 1.05× with each on huge pages of its own. A slab goes back only when all its blocks have, so
/// buffers that come and go (a layer's intermediate results) must not take `sideBySide`.
func allocateWeightMemory(byteCount: Int, sideBySide: Bool = false) -> UnsafeMutableRawPointer {
    if sideBySide, byteCount < hugePage, let pointer = weightSlabs.allocate(byteCount: byteCount) { return pointer }
    var raw: UnsafeMutableRawPointer?
    let status = posix_memalign(&raw, byteCount >= hugePage ? hugePage : 64, max(byteCount, 64))
    precondition(status == 0 && raw != nil, "out of memory allocating \(byteCount) bytes")
    offerHugePages(raw!, byteCount: byteCount)
    return raw!
}

func releaseWeightMemory(_ pointer: UnsafeMutableRawPointer) {
    if !weightSlabs.release(pointer) { free(pointer) }
}

private let hugePage = 2 << 20

/// Offers the whole huge pages of a huge-page-aligned block to transparent huge pages. The tail past the last whole
/// huge page keeps small pages, so nothing becomes resident that the block does not use.
private func offerHugePages(_ pointer: UnsafeMutableRawPointer, byteCount: Int) {
    #if os(Linux)
    if byteCount >= hugePage { _ = madvise(pointer, byteCount / hugePage * hugePage, MADV_HUGEPAGE) }
    #endif
}

private let weightSlabs = WeightSlabs()

/// Slabs of huge pages from which weights under 2 MiB are cut one after another. A slab goes back to the allocator
/// when its last block is released; space of blocks released before then is not reused, so a slab holds at most
/// what its blocks once took (a model's weights are released together when it is).
private final class WeightSlabs: @unchecked Sendable {
    private static let slabBytes = 16 * hugePage

    private struct Slab {
        let base: UnsafeMutableRawPointer
        var used: Int
        var liveBlocks: Int
        func holds(_ pointer: UnsafeMutableRawPointer) -> Bool { pointer >= base && pointer < base + WeightSlabs.slabBytes }
    }

    private let lock = NSLock()
    /// New blocks are cut from the last.
    private var slabs: [Slab] = []

    /// A 64-byte aligned block, or nil where a slab cannot be allocated.
    func allocate(byteCount: Int) -> UnsafeMutableRawPointer? {
        let size = (max(byteCount, 64) + 63) & ~63
        lock.lock()
        defer { lock.unlock() }
        if slabs.last.map({ $0.used + size > Self.slabBytes }) ?? true {
            var raw: UnsafeMutableRawPointer?
            guard posix_memalign(&raw, hugePage, Self.slabBytes) == 0, let base = raw else { return nil }
            offerHugePages(base, byteCount: Self.slabBytes)
            slabs.append(Slab(base: base, used: 0, liveBlocks: 0))
        }
        let last = slabs.count - 1
        let block = slabs[last].base + slabs[last].used
        slabs[last].used += size
        slabs[last].liveBlocks += 1
        return block
    }

    /// Whether `pointer` was cut from a slab (and is now released).
    func release(_ pointer: UnsafeMutableRawPointer) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        guard let index = slabs.firstIndex(where: { $0.holds(pointer) }) else { return false }
        slabs[index].liveBlocks -= 1
        if slabs[index].liveBlocks == 0 { free(slabs.remove(at: index).base) }
        return true
    }
}
