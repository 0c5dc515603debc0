/// Errors of the pipelines themselves (models, tokenizers and images report their own).
public enum PipelineError: Error, CustomStringConvertible {
    case noCandidateLabels
    case noInputs
    /// A conversation was given but the pipeline has no chat template.
    case noChatTemplate
    /// The prompt tokenized to nothing.
    case emptyPrompt
    /// A prompt has more tokens than the model or the session takes.
    case promptTooLong(tokens: Int, limit: Int)
    /// A text (a label in its template) has more tokens than a text tower of fixed length takes.
    case textTooLong(String, tokens: Int, limit: Int)
    /// Token ids given for a text tower that pads every text to a fixed length.
    case tokenIdsNotAccepted
    /// A checkpoint's processor files do not say how to lay out a prompt.
    case invalidProcessor(String, String)
    /// A top-k that is not positive.
    case invalidTopK(Int)
    /// A message holds an image part, and the model reads no images.
    case imagesNotSupported(message: Int)
    /// The rendered conversation marks a different number of images than its messages hold.
    case imageCountMismatch(markers: Int, images: Int, marker: String)
    /// An image part refers to an image that cannot be read (`reference` as given, shortened).
    case unreadableImage(reference: String, reason: String)
    /// A label (1-based position) is empty or only spaces.
    case emptyLabel(position: Int)
    /// A label has more tokens than the text model takes.
    case labelTooLong(String, tokens: Int, limit: Int)
    /// An image has more pixels than images may have (Pillow's decompression-bomb limit).
    case imageTooLarge(width: Int, height: Int, limit: Int)
    /// Pan and scan was asked of a model whose processor does not crop so (only Gemma 3's does).
    case panAndScanNotSupported

    public var description: String {
        switch self {
        case .noCandidateLabels: return "no candidate labels: give at least one label"
        case .noInputs: return "nothing to process: give at least one input"
        case .noChatTemplate:
            return "the checkpoint has no chat template (chat_template.jinja or tokenizer_config.json), so messages cannot be rendered"
        case .emptyPrompt: return "the prompt is empty: it tokenized to no tokens"
        case .promptTooLong(let tokens, let limit): return "the prompt is \(tokens) tokens long, more than the \(limit) allowed"
        case .textTooLong(let text, let tokens, let limit):
            return "the text \(String(reflecting: text)) is \(tokens) tokens long with its end-of-text token, more than the \(limit) the text model takes"
        case .tokenIdsNotAccepted:
            return "this model pads every text to a fixed length: give texts, not token ids"
        case .invalidProcessor(let directory, let reason): return "\(directory): \(reason)"
        case .invalidTopK(let k): return "--top-k must be positive, got \(k)"
        case .imagesNotSupported(let message):
            return "message \(message) holds an image, and this model reads no images (it has no vision tower)"
        case .imageCountMismatch(let markers, let images, let marker):
            return "the chat template wrote \(markers) \(marker) markers for the \(images) images of the messages; they must match"
        case .unreadableImage(let reference, let reason): return "\(reference): \(reason)"
        case .emptyLabel(let position): return "label \(position) is empty"
        case .labelTooLong(let label, let tokens, let limit):
            return "label \"\(label.prefix(40))\(label.count > 40 ? "…" : "")\" is \(tokens) tokens long, more than the \(limit) the text model takes"
        case .imageTooLarge(let width, let height, let limit):
            return "a \(width)x\(height) image has more than the \(limit) pixels an image may have"
        case .panAndScanNotSupported:
            return "pan and scan is Gemma 3's way of reading images; this model's processor does not crop images so"
        }
    }
}
