import VLMTensor

// What decoders that attend to an encoder's output share (GPT-2 with cross-attention, BLIP's text decoder, T5's
// decoder): the encoder's keys and values computed once per binding, rows repeated for beams, and the decoder bound
// to them as a language model that generation drives.

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

/// A model whose decoder passes can attend to an encoder's output: what ``CrossAttendingDecoder`` binds.
protocol CrossAttendingModel: AnyObject {
    var vocabularySize: Int { get }
    func embed(_ ids: [[Int]]) throws -> Tensor
    /// An empty cache of the decoder's self-attention.
    func makeCache(batch: Int, capacity: Int) throws -> KVCache
    /// The decoder's logits, as ``CausalLanguageModel``'s, cross-attending to `encoder` (none when nil, as
    /// transformers' decoder layers skip cross-attention without encoder states).
    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool, encoder: CrossAttentionContext?) throws -> Tensor
}

/// A decoder bound to one batch of encoder states (from `attending(to:attentionMask:)` of GPT-2, BLIP's text decoder
/// or T5): a ``CausalLanguageModel`` that `generate` drives like any other, each pass attending to the encoder keys
/// and values computed at binding.
public final class CrossAttendingDecoder: CausalLanguageModel, @unchecked Sendable {
    let model: any CrossAttendingModel
    let context: CrossAttentionContext

    init(model: any CrossAttendingModel, context: CrossAttentionContext) {
        self.model = model
        self.context = context
    }

    /// Rows of the encoder states this decoder attends to.
    public var encoderBatch: Int { context.batch }

    public var vocabularySize: Int { model.vocabularySize }

    public func embed(_ ids: [[Int]]) throws -> Tensor { try model.embed(ids) }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache { try model.makeCache(batch: batch, capacity: capacity) }

    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try model.logits(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                         lastPositionOnly: lastPositionOnly, encoder: context)
    }
}
