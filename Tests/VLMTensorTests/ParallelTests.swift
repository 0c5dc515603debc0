import CVLMKernels
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

    /// The kernel's id of the calling thread, from /proc/thread-self (`PID/task/TID`).
    private static func threadID() -> String {
        var link = [CChar](repeating: 0, count: 64)
        let length = readlink("/proc/thread-self", &link, link.count - 1)
        return length > 0 ? String(decoding: link[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
    }

    /// A thread's parallel work leaves OpenMP workers behind until it releases them, and then they are gone (what
    /// keeps the thread that loaded a model from slowing the batcher's: see releaseParallelWorkers).
    @Test(.enabled(if: processorCount > 1)) func releasingEndsTheWorkersTheCallingThreadStarted() throws {
        final class Seen: @unchecked Sendable {
            let lock = NSLock()
            var workers: [String] = []
            var teamSize = 0
        }
        let seen = Seen()
        nonisolated(unsafe) var aliveBefore: [Bool] = [], aliveAfter: [Bool] = []
        let finished = DispatchSemaphore(value: 0)
        // A thread of its own: its pool is its own, not one another test's work shares.
        let thread = Thread {
            let ran = vlm_parallel_team({ context, thread, threads in
                let seen = Unmanaged<Seen>.fromOpaque(context!).takeUnretainedValue()
                seen.lock.lock()
                seen.teamSize = Int(threads)
                if thread != 0 { seen.workers.append(ParallelTests.threadID()) }
                seen.lock.unlock()
            }, Unmanaged.passUnretained(seen).toOpaque())
            if ran == 0 {
                aliveBefore = seen.workers.map { FileManager.default.fileExists(atPath: "/proc/\($0)") }
                releaseParallelWorkers()
                // Joined threads leave /proc once the kernel has reaped them, a moment later on a busy machine.
                let deadline = Date().addingTimeInterval(10)
                repeat {
                    aliveAfter = seen.workers.map { FileManager.default.fileExists(atPath: "/proc/\($0)") }
                    if aliveAfter.contains(true) { usleep(1000) }
                } while aliveAfter.contains(true) && Date() < deadline
            }
            finished.signal()
        }
        thread.start()
        finished.wait()
        try #require(seen.teamSize > 1, "the OpenMP runtime ran a team of \(seen.teamSize)")
        #expect(seen.workers.count == seen.teamSize - 1)
        #expect(aliveBefore.allSatisfy { $0 })
        #expect(aliveAfter.allSatisfy { !$0 })
    }
}
