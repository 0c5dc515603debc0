import Testing
@testable import VLMTensor

/// Large blocks go back to a cache when their tensor dies and are handed out again for the same size, so that a
/// forward pass does not fault in fresh pages for every activation. The odd sizes keep other tests' tensors away.
@Suite struct TensorStorageTests {
    @Test func aFreedLargeBlockServesTheNextTensorOfItsSize() {
        let count = 1_000_003
        var address = Tensor(uninitialized: [count]).storage.pointer
        for _ in 0..<3 {
            let tensor = Tensor(uninitialized: [count])
            #expect(tensor.storage.pointer == address)
            address = tensor.storage.pointer
        }
    }

    /// A decoding step's logits row (SmolLM2: 49,152 floats) is in the cache's range, from 64 KiB up.
    @Test func aFreedBlockJustOver64KiBIsReused() {
        let count = 16_411
        let address = Tensor(uninitialized: [count]).storage.pointer
        #expect(Tensor(uninitialized: [count]).storage.pointer == address)
    }

    @Test func aLiveBlockIsNotHandedOutTwice() {
        let count = 1_000_033
        let first = Tensor(uninitialized: [count])
        let second = Tensor(uninitialized: [count])
        #expect(first.storage.pointer != second.storage.pointer)
    }

    @Test func zerosAreZeroInAReusedBlock() {
        let count = 1_000_037
        do {
            let dirty = Tensor(uninitialized: [count])
            dirty.withUnsafeMutableBufferPointer { $0.initialize(repeating: 7) }
        }
        #expect(Tensor(zeros: [count]).scalars.allSatisfy { $0 == 0 })
    }
}
