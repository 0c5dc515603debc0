import Foundation
import SwiftVLM

/// At most `limit` pieces of heavy work at a time (reading and encoding images, embedding batches), the others
/// waiting their turn in order: concurrent requests with images would otherwise each hold a photo's pixels and
/// features in memory at once and fight over the cores.
actor WorkLimiter {
    private let limit: Int
    private var running = 0
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(limit: Int) { self.limit = max(1, limit) }

    /// Runs `work` off the caller's executor once a slot is free, with images held to `maxImagePixels`.
    func run<T: Sendable>(maxImagePixels: Int, _ work: @escaping @Sendable () throws -> T) async throws -> T {
        if running >= limit {
            await withCheckedContinuation { waiting.append($0) }
        } else {
            running += 1
        }
        defer {
            if waiting.isEmpty { running -= 1 } else { waiting.removeFirst().resume() }
        }
        return try await Task.detached {
            // The shared pool's thread is not the batcher's: its OpenMP workers must not outlive the work.
            defer { releaseParallelWorkers() }
            return try ImageDecoder.$maxPixels.withValue(maxImagePixels, operation: work)
        }.value
    }
}
