import Foundation

extension Pipeline {
    /// transformers 5.23's `Siglip2Tokenizer`, which AutoTokenizer loads for every siglip2 checkpoint whatever
    /// tokenizer_config.json names (the published ones say "GemmaTokenizer", a class 5.23 lists as wrong for this
    /// model type): the vocabulary and merges of tokenizer.json in the class's own pipeline, the file's normalizer,
    /// pre-tokenizer and decoder replaced. Gemma's: spaces become "▁" after SigLIP 2's training-time lowercasing, a
    /// split at spaces (none are left), a byte-fallback BPE with unknown pieces fused. The special tokens around a
    /// text come from `add_bos_token`/`add_eos_token` where tokenizer_config.json sets either (the published files:
    /// `<eos>` appended), else from tokenizer.json's post-processor. The class pads on the left unless the config
    /// says otherwise.
    init(siglip2TokenizerJSON json: JSONObject, config: JSONObject?) throws {
        self = try Pipeline(tokenizerJSON: json)
        guard let bpe = model as? BPE else {
            throw TokenizerError.invalidField(file: json.file, path: "$.model.type", reason: "Siglip2Tokenizer reads BPE models")
        }
        let unknown = try config?.tokenContent("unk_token") ?? "<unk>"
        model = bpe.reconfigured(unknownToken: unknown, fuseUnknown: true, byteFallback: true, ignoreMerges: false)
        normalizer = NormalizerSequence(normalizers: [Lowercase(), Replace(pattern: LiteralPattern(literal: [" "]), content: ["\u{2581}"])])
        preTokenizer = Split(pattern: LiteralPattern(literal: [" "]), behavior: .mergedWithPrevious, invert: false)
        decoder = DecoderSequence(decoders: [ReplaceDecoder(pattern: LiteralPattern(literal: ["\u{2581}"]), content: [" "]),
                                             ByteFallbackDecoder(), FuseDecoder()])
        padsOnLeftByDefault = true
        guard let config, !config.isNull("add_bos_token") || !config.isNull("add_eos_token") else { return }
        // TokenizersBackend.update_post_processor: each flag set adds its token (if the vocabulary has it) around
        // every sequence.
        func special(_ flag: String, _ key: String, default defaultValue: String) throws -> [(id: Int, token: String)] {
            guard try config.bool(flag, default: false) else { return [] }
            let content = try config.tokenContent(key) ?? defaultValue
            guard let id = addedTokens.first(where: { $0.content.utf8.elementsEqual(content.utf8) })?.id ?? model.tokenId(content) else { return [] }
            return [(id, content)]
        }
        let bos = try special("add_bos_token", "bos_token", default: "<bos>")
        let eos = try special("add_eos_token", "eos_token", default: "<eos>")
        func sequence(second: Bool) -> [Template.Piece] {
            let typeId = second ? 1 : 0
            return (bos.isEmpty ? [] : [.special(bos, typeId: typeId)]) + [.sequence(second: second, typeId: typeId)]
                + (eos.isEmpty ? [] : [.special(eos, typeId: typeId)])
        }
        postProcessor = Template(single: sequence(second: false), pair: sequence(second: false) + sequence(second: true))
    }
}
