import Foundation
import Testing
@testable import VLMTensor

/// `parallelRanges` hands out shrinking ranges: together they must cover the work exactly once.
@Suite struct ParallelTests {
    private func ranges(count: Int, grain: Int) -> [Range<Int>] {
        let lock = NSLock()
        nonisolated(unsafe) var seen: [Range<Int>] = []
        parallelRanges(count, grain: grain) { range in
            lock.lock()
            seen.append(range)
            lock.unlock()
        }
        return seen.sorted { $0.lowerBound < $1.lowerBound }
    }

    @Test(arguments: [(1, 1), (7, 2), (1000, 1), (1000, 3), (4099, 64)])
    func rangesCoverTheWorkOnceInPiecesOfAtLeastTheGrain(count: Int, grain: Int) {
        let pieces = ranges(count: count, grain: grain)
        #expect(pieces.first?.lowerBound == 0)
        #expect(pieces.last?.upperBound == count)
        for (before, after) in zip(pieces, pieces.dropFirst()) { #expect(before.upperBound == after.lowerBound) }
        #expect(pieces.allSatisfy { !$0.isEmpty && ($0.count >= grain || $0.upperBound == count) })
        // Each claim takes at most half of what is left, so large work comes in several pieces.
        if count >= 4 * grain { #expect(pieces.count > 1) }
    }

    @Test func noWorkCallsNothing() {
        #expect(ranges(count: 0, grain: 1).isEmpty)
    }
}
