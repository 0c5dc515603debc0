import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels
import VLMTensor

/// A cache kept in fp16 holds, through every operation on it, the halves of what an fp32 cache of the same model
/// holds: stored prompts, copies into a larger cache, beam reordering and packing rows for a batch. Only the first
/// layer's keys and values are the same numbers in both models: later layers' come from attention over the rounded
/// ones.
@Suite struct KVCacheTests {
    /// The stored positions of every layer, row and head, as floats (an fp32 cache's rounded to halves first).
    static func stored(_ cache: KVCache, rounding: Bool) -> [[Float]] {
        let headDim = cache.width / cache.heads
        return cache.layers.map { layer in
            let (keys, values): (Tensor, Tensor)
            switch layer {
            case let .floats(key, value): (keys, values) = (key, value)
            case let .halves(key, value): (keys, values) = (key.floats, value.floats)
            }
            var floats: [Float] = []
            for tensor in [keys, values] {
                for row in 0..<cache.batch {
                    for head in 0..<cache.heads {
                        let start = ((row * cache.heads + head) * cache.capacity) * headDim
                        floats += tensor.scalars[start..<(start + cache.length * headDim)]
                    }
                }
            }
            guard rounding else { return floats }
            let halves = HalfTensor(uninitialized: [floats.count])
            roundToHalves(floats, count: floats.count, into: halves.pointer)
            return halves.floats.scalars
        }
    }

    @Test func halfCacheHoldsTheHalvesOfAnFP32Cache() throws {
        let directory = try ModelDirectory(url: LlamaFixture.root.appendingPathComponent("gqa-untied"))
        let models = try [KVCache.ElementType.float32, .float16].map { type in
            try KVCache.ElementType.$forNewModels.withValue(type) { try LlamaForCausalLM(directory: directory) }
        }
        let prompts = [[1, 17, 45, 99, 3], [1, 8, 9, 10, 11]]
        let caches = try models.map { model in
            let cache = try model.makeCache(batch: 2, capacity: 12)
            _ = try model.logits(inputIds: prompts, cache: cache)
            return cache
        }
        #expect(caches.map(\.elementType) == [.float32, .float16])
        #expect(caches[1].bytesPerPosition * 2 == caches[0].bytesPerPosition)
        func expectHalves(_ what: String, _ full: KVCache, _ half: KVCache) {
            #expect(full.length == half.length, "\(what)")
            let (rounded, halves) = (Self.stored(full, rounding: true)[0], Self.stored(half, rounding: false)[0])
            let differing = zip(rounded, halves).filter { $0 != $1 }.count
            #expect(!rounded.isEmpty && differing == 0, "\(what): \(differing) of \(rounded.count) differ")
        }
        expectHalves("prompts", caches[0], caches[1])

        let larger = try models.map { try $0.makeCache(batch: 2, capacity: 20) }
        for (cache, target) in zip(caches, larger) { try cache.copyStored(into: target, count: 4) }
        expectHalves("copied", larger[0], larger[1])

        for cache in caches { try cache.reorder(rows: [1, 1]) }
        expectHalves("reordered", caches[0], caches[1])

        let packed = try caches.map { cache in
            try KVCache.packing([.init(cache: cache, row: 0, count: 2), .init(cache: larger[cache.elementType == .float32 ? 0 : 1],
                                                                               row: 1, count: 4)], capacity: 8)
        }
        expectHalves("packed", packed[0], packed[1])
        #expect(throws: ModelError.self) { try caches[1].copyStored(into: larger[0]) }
    }
}
