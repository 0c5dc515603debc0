import Foundation
import VLMTemplates
import VLMTokenizers

/// How a conversation with images becomes a language model's prompt, as transformers' processors lay it out
/// (`processor.apply_chat_template(messages, tokenize=True)`): the chat template rendered, each image marker it writes
/// expanded into the image's tokens, the text tokenized. What image chat (``ImageTextToTextPipeline``) and LLaVA
/// training (``LlavaTrainingPipeline``) share; it needs no model.
public struct ImageChatPromptLayout: Sendable {
    public let processor: any ImageChatProcessor
    public let chatTemplate: ChatTemplate
    /// Whether messages reach the chat template with text contents, each image part written as the image token, as
    /// llama.cpp gives them to a language model's own template (which reads string contents only): text parts joined
    /// by newlines, none next to an image.
    public let imagePartsAsText: Bool

    public init(processor: any ImageChatProcessor, chatTemplate: ChatTemplate, imagePartsAsText: Bool = false) {
        self.processor = processor
        self.chatTemplate = chatTemplate
        self.imagePartsAsText = imagePartsAsText
    }

    /// The conversation's prompt ids: the chat template rendered with the generation prompt (without it when
    /// `addGenerationPrompt` is false: a whole conversation to train on), its i-th image marker expanded into
    /// `imageTokenCounts[i]` image tokens, the text tokenized with the tokenizer's special tokens unless the template
    /// already wrote the bos token (as transformers' processors do).
    ///
    /// - Throws: `PipelineError.imageCountMismatch` when the template wrote a different number of markers than
    ///   there are images.
    /// - Parameters:
    ///   - templateArguments: more template variables (`apply_chat_template(**kwargs)`).
    ///   - continueFinalMessage: `continue_final_message=True`, no generation prompt: the prompt ends inside the last
    ///     message, for the model to continue it.
    public func promptIds(_ messages: [JSONValue], imageTokenCounts: [Int], addGenerationPrompt: Bool = true,
                          templateArguments: [String: JSONValue] = [:], continueFinalMessage: Bool = false) throws -> [Int] {
        let tokenizer = processor.tokenizer
        let rendered = try chatTemplate.render(messages: imagePartsAsText ? messages.map(contentAsText) : messages,
                                               addGenerationPrompt: addGenerationPrompt && !continueFinalMessage,
                                               bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token),
                                               eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token),
                                               extraContext: templateArguments, continueFinalMessage: continueFinalMessage)
        return try encode(expandingImageMarkers(in: rendered, imageTokenCounts: imageTokenCounts).text, rendered: rendered).ids
    }

    /// transformers' `processor.apply_chat_template(messages, tokenize=True, return_dict=True,
    /// return_assistant_tokens_mask=True)`: the whole conversation's ids as ``promptIds(_:imageTokenCounts:addGenerationPrompt:)``
    /// lays them out without the generation prompt, and 1 for each token overlapping the text of the template's
    /// `{% generation %}` blocks (the assistant's replies in templates written for training; the blocks' places
    /// shifted past the image markers expanded before them), 0 elsewhere: the tokens supervised fine-tuning scores
    /// (TRL's `assistant_only_loss`). A template without generation blocks marks none.
    public func conversationIdsWithAssistantMask(_ messages: [JSONValue], imageTokenCounts: [Int]) throws
        -> (ids: [Int], assistantMask: [Int])
    {
        let tokenizer = processor.tokenizer
        let rendered = try chatTemplate.renderMarkingGenerations(
            messages: imagePartsAsText ? messages.map(contentAsText) : messages, addGenerationPrompt: false,
            bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token), eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
        let expansion = try expandingImageMarkers(in: rendered.text, imageTokenCounts: imageTokenCounts)
        let encoding = try encode(expansion.text, rendered: rendered.text)
        // A character's place after the expansion: moved by what the markers ending at or before it gained.
        func shifted(_ offset: Int) -> Int {
            offset + (expansion.markers.last { $0.end <= offset }?.gainedSoFar ?? 0)
        }
        var mask = Array(repeating: 0, count: encoding.ids.count)
        for span in rendered.generations {
            let (start, end) = (shifted(span.lowerBound), shifted(span.upperBound))
            for (index, offsets) in encoding.offsets.enumerated() where offsets.lowerBound < end && offsets.upperBound > start {
                mask[index] = 1
            }
        }
        return (encoding.ids, mask)
    }

    /// `rendered` with its i-th image marker expanded for `imageTokenCounts[i]` tokens, and where each marker ended in
    /// `rendered` (Unicode scalar offsets) with the characters the expansion had added up to its end.
    private func expandingImageMarkers(in rendered: String, imageTokenCounts: [Int]) throws
        -> (text: String, markers: [(end: Int, gainedSoFar: Int)])
    {
        let marker = processor.imageToken
        let pieces = rendered.components(separatedBy: marker)
        guard pieces.count - 1 == imageTokenCounts.count else {
            throw PipelineError.imageCountMismatch(markers: pieces.count - 1, images: imageTokenCounts.count, marker: marker)
        }
        let markerLength = marker.unicodeScalars.count
        var expanded = pieces[0], end = pieces[0].unicodeScalars.count, gained = 0
        var markers: [(end: Int, gainedSoFar: Int)] = []
        for (count, piece) in zip(imageTokenCounts, pieces.dropFirst()) {
            let image = processor.imageText(tokenCount: count)
            expanded += image + piece
            end += markerLength
            gained += image.unicodeScalars.count - markerLength
            markers.append((end, gained))
            end += piece.unicodeScalars.count
        }
        return (expanded, markers)
    }

    /// The expanded conversation tokenized with the tokenizer's special tokens unless the template already wrote the
    /// bos token, as transformers' processors do.
    private func encode(_ expanded: String, rendered: String) throws -> Encoding {
        let tokenizer = processor.tokenizer
        let writesBos = tokenizer.bosTokenId.flatMap(tokenizer.token).map(rendered.hasPrefix) ?? false
        let encoding = tokenizer.encode(expanded, addSpecialTokens: !writesBos)
        guard !encoding.ids.isEmpty else { throw PipelineError.emptyPrompt }
        return encoding
    }

    /// `message` with its list of parts as one text, as llama.cpp's chat code joins them (`concat_content_parts`).
    private func contentAsText(_ message: JSONValue) -> JSONValue {
        guard case let .object(fields) = message, case let .array(parts)? = message["content"] else { return message }
        var text = "", lastWasImage = false
        for part in parts {
            if part["type"] == .string("image") {
                text += processor.imageToken
                lastWasImage = true
            } else if part["type"] == .string("text"), case let .string(piece)? = part["text"] {
                if !lastWasImage && !text.isEmpty { text += "\n" }
                text += piece
                lastWasImage = false
            }
        }
        return .object(fields.map { $0.0 == "content" ? ($0.0, .string(text)) : $0 })
    }
}
