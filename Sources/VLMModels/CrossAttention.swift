import VLMTensor

// What decoders that attend to an encoder's output share (GPT-2 with cross-attention, T5's decoder): the encoder's
// keys and values computed once per binding, and rows repeated for beams.

/// Each layer's cross-attention keys and values for one encoder output, computed once.
struct CrossAttentionContext: @unchecked Sendable {
    /// Per layer, `[encoderBatch, encoderLength, width]`.
    let keys: [Tensor], values: [Tensor]
    /// `[encoderBatch, encoderLength]`, nil when every position counts.
    let mask: Tensor?
    let batch: Int, length: Int

    /// Layer `index`'s keys, values and mask for a pass of `rows` rows: the encoder rows themselves, or each one
    /// repeated for consecutive rows when `rows` is a multiple of the encoder batch (generate's `repeat_interleave`
    /// for beams or several return sequences).
    func operands(layer index: Int, rows: Int) -> (keys: Tensor, values: Tensor, mask: Tensor?) {
        let copies = rows / batch
        if copies == 1 { return (keys[index], values[index], mask) }
        return (repeatRows(keys[index], copies), repeatRows(values[index], copies), mask.map { repeatRows($0, copies) })
    }

    /// Throws unless a pass of `rows` rows can attend to this context: one row per encoder row, or a multiple.
    func check(rows: Int) throws {
        if rows % batch != 0 {
            throw ModelError.invalidInput("\(rows) rows do not attend to \(batch) encoder outputs (need a multiple)")
        }
    }
}

/// An encoder's attention mask `[batch][length]` (1 for positions to attend to) as a key padding mask, nil when it
/// masks nothing.
func encoderKeyPaddingMask(_ attentionMask: [[Int]]?, batch: Int, length: Int) throws -> Tensor? {
    guard let attentionMask else { return nil }
    guard attentionMask.count == batch, attentionMask.allSatisfy({ $0.count == length }) else {
        throw ModelError.invalidInput("the encoder attention mask must be [\(batch)][\(length)]")
    }
    guard attentionMask.contains(where: { $0.contains(0) }) else { return nil }
    return Tensor(shape: [batch, length], scalars: attentionMask.flatMap { $0.map { $0 != 0 ? 1 : 0 } })
}
