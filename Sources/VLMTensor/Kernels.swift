internal import CVLMKernels
internal import Foundation

/// Which implementation of the hand-written kernels in CVLMKernels runs. Everything uses `best`; tests pin
/// `scalar` to check the portable fallback on machines that would otherwise never run it. `vector` is the widest
/// vector code the CPU runs: AVX-512, or AVX2 and FMA.
enum KernelPath: Sendable {
    case vector
    case scalar

    /// The CPU's vector instruction set, read once.
    static let vectorISA: vlm_kernel_isa = vlm_best_isa()

    static let best: KernelPath = vectorISA == VLM_ISA_SCALAR ? .scalar : .vector

    var isa: vlm_kernel_isa { self == .vector ? Self.vectorISA : VLM_ISA_SCALAR }
}

/// Cores to spread work over, read once: Foundation reads the cgroup files again on every call.
let processorCount = ProcessInfo.processInfo.activeProcessorCount

/// Runs `body(i)` for every `i` in `0..<count` on every core and returns when all have finished. The work goes to
/// the OpenMP threads that oneDNN's primitives run on where that runtime is loaded (see CVLMKernels/parallel.c for
/// why), to Dispatch's threads otherwise.
func parallelFor(_ count: Int, _ body: @Sendable (Int) -> Void) {
    if count <= 1 {
        if count == 1 { body(0) }
        return
    }
    withoutActuallyEscaping(body) { body in
        var task = body
        let handedOver = withUnsafeMutablePointer(to: &task) { pointer in
            vlm_parallel_for(count, { context, index in
                context!.assumingMemoryBound(to: (@Sendable (Int) -> Void).self).pointee(index)
            }, pointer) == 0
        }
        if !handedOver { DispatchQueue.concurrentPerform(iterations: count, execute: body) }
    }
}

/// Ends the OpenMP workers that the calling thread's parallel work started; call it where a thread that is not a
/// model's steady one (a task on Swift's shared pool, the thread that loaded a model, a loop about to wait) is done
/// with heavy work. GNU OpenMP keeps a pool of workers for every thread that starts parallel work, and once the
/// process holds more of them than it has cores it stops spinning at barriers: every barrier and every hand-over
/// goes through the kernel. `vlm serve` with one client decoded SmolLM2-135M Q4_1 at 199 tokens/s while the pool of
/// the thread that had loaded the model lingered beside the batcher's, 562 once it was ended (2-core Zen 5 VM,
/// `vlm bench`: 599).
public func releaseParallelWorkers() { _ = vlm_parallel_release_workers() }

/// Runs `body` on disjoint ranges covering `0..<count` on every core, ranges shrinking as the work runs out (see
/// `vlm_parallel_ranges`); none is shorter than `grain` unless less is left. For streaming kernels whose work
/// divides finely but that pay for each restart.
func parallelRanges(_ count: Int, grain: Int, _ body: @Sendable (Range<Int>) -> Void) {
    // One range's worth runs here: a parallel region would hand it all to one thread and wake the others for nothing.
    if count <= grain {
        if count > 0 { body(0..<count) }
        return
    }
    withoutActuallyEscaping(body) { body in
        var task = body
        let handedOver = withUnsafeMutablePointer(to: &task) { pointer in
            vlm_parallel_ranges(count, grain, { context, start, end in
                context!.assumingMemoryBound(to: (@Sendable (Range<Int>) -> Void).self).pointee(start..<end)
            }, pointer) == 0
        }
        if !handedOver {
            let parts = min(count, 4 * processorCount), size = (count + parts - 1) / max(parts, 1)
            DispatchQueue.concurrentPerform(iterations: parts) { part in
                let range = (part * size)..<min(count, (part + 1) * size)
                if !range.isEmpty { body(range) }
            }
        }
    }
}
