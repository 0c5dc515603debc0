import ArgumentParser
import Foundation
import SwiftVLM

struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Model speed: image embedding for image-text models (a photo of noise through the checkpoint's processor, or random pixels for BLIP retrieval; median of several runs); prompt prefill and greedy decoding for language models (a llama.cpp .gguf file or a checkpoint); image features, first token and decoding of a caption for image-to-text models; one photo with --labels prompts for segmentation and detection models.")

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption
    @OptionGroup var cache: CacheTypeOption
    @OptionGroup var panAndScan: PanAndScanOption

    @Option(help: "Images per forward pass (image-text models).")
    var batchSize = 1

    @Option(help: "Timed runs after the warm-up; the median counts.")
    var runs = 5

    @Option(help: "Text prompts asked of the one photo (segmentation and detection models).")
    var labels = 3

    @Option(help: "Prompt length in tokens (language models).")
    var promptTokens = 256

    @Option(help: "Tokens generated one at a time after the prompt (language models).")
    var newTokens = 128

    @Option(help: "A photo to talk about (image chat models such as LLaVA, with --prompt): image features, first token and --new-tokens decoding steps of the answer.")
    var image: String?

    @Option(help: "The question about --image, one user turn through the chat template.")
    var prompt: String?

    @Option(help: "llama.cpp's image encoder file for a GGUF --model (LLaVA-1.5, LLaVA-NeXT or Gemma 3), with --image and --prompt.")
    var mmproj: String?

    @Flag(help: "Print JSON instead of a sentence.")
    var json = false

    private struct ImageReport: Encodable {
        let task = "image-embedding"
        let batchSize: Int
        let msPerItem: Double
        /// The precision the linear layers ran in.
        let dtype: MatrixPrecision

        enum CodingKeys: String, CodingKey {
            case task, batchSize = "batch_size", msPerItem = "ms_per_item", dtype
        }
    }

    private struct TextReport: Encodable {
        let task = "text-generation"
        let promptTokens: Int
        let newTokens: Int
        let prefillTokensPerSecond: Double
        let decodeTokensPerSecond: Double
        /// The precision the linear layers ran in (GGUF-quantized matrices: the activations' type).
        let dtype: MatrixPrecision
        /// What the KV cache held keys and values in (`f32`, `f16`).
        let cacheType: String

        enum CodingKeys: String, CodingKey {
            case task, promptTokens = "prompt_tokens", newTokens = "new_tokens"
            case prefillTokensPerSecond = "prefill_tokens_per_s", decodeTokensPerSecond = "decode_tokens_per_s", dtype
            case cacheType = "cache_type"
        }
    }

    func validate() throws {
        guard batchSize > 0, runs > 0, labels > 0 else { throw ValidationError("--batch-size, --runs and --labels must be positive") }
        guard promptTokens > 0, newTokens > 0 else { throw ValidationError("--prompt-tokens and --new-tokens must be positive") }
        guard (image == nil) == (prompt == nil) else { throw ValidationError("--image and --prompt go together") }
        guard mmproj == nil || image != nil else { throw ValidationError("--mmproj goes with --image and --prompt") }
    }

    private static let imageChatOnly = ValidationError("--image and --prompt are for image chat models such as LLaVA")

    func run() async throws {
        try await cache.building { try await runWithCacheType() }
    }

    private func runWithCacheType() async throws {
        guard mmproj == nil || options.model.hasSuffix(".gguf") else { throw ValidationError("--mmproj goes with a GGUF --model") }
        guard !panAndScan.panAndScan || (image != nil && prompt != nil) else {
            throw ValidationError("--pan-and-scan goes with --image and --prompt (Gemma 3's image chat)")
        }
        if options.model.hasSuffix(".gguf") {
            let ran = (precision.dtype ?? .float32).available
            if let mmproj, let image, let prompt {
                let pair = try precision.building {
                    try ImageTextToTextPipeline(gguf: URL(fileURLWithPath: options.model), mmproj: URL(fileURLWithPath: mmproj))
                }
                try benchImageTextToText(pair, image: image, prompt: prompt, precision: ran)
                return
            }
            guard image == nil else { throw Self.imageChatOnly }
            try benchLanguageModel(precision.building {
                try ModelRegistry.causalLanguageModel(gguf: GGUFFile(url: URL(fileURLWithPath: options.model))).model
            }, precision: ran)
            return
        }
        let directory = try ModelDirectory(url: try await options.directory())
        let builder = try ModelRegistry.family(of: directory).builder
        if case .imageToText = builder {} else if image != nil { throw Self.imageChatOnly }
        // The precision the command that runs this model would pick.
        let requested: MatrixPrecision
        switch builder {
        case .imageTextDualEncoder, .imageToText:
            requested = try precision.dtype ?? WeightStore(directory: directory.url).defaultMatrixPrecision
        default:
            requested = precision.dtype ?? .float32
        }
        try MatrixPrecision.$forNewLayers.withValue(requested) { try bench(builder, directory: directory, precision: requested.available) }
    }

    /// Times the model `builder` makes of `directory`, as the command's options ask.
    private func bench(_ builder: ModelBuilder, directory: ModelDirectory, precision: MatrixPrecision) throws {
        switch builder {
        case .causalLanguageModel(let build): try benchLanguageModel(build(directory), precision: precision)
        case .imageTextDualEncoder(let build):
            let model = try build(directory)
            // A photo of noise through the checkpoint's processor: SigLIP 2's input depends on the photo's shape.
            var generator = SeededGenerator(seed: 0x5EED)
            let photo = RGBImage(width: 640, height: 480, pixels: (0..<(640 * 480 * 3)).map { _ in UInt8.random(in: 0...255, using: &generator) })
            let inputs = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
                .preprocess(Array(repeating: photo, count: batchSize))
            try benchImageModel(precision: precision) { try model.imageFeatures(inputs) }
        case .imageTextMatching(let build):
            let model = try build(directory)
            let pixels = randomPixels(side: model.imageSize)
            try benchImageModel(precision: precision) { try model.imageEmbeddings(pixelValues: pixels) }
        case .visualQuestionClassifier(let build): try benchQuestionClassifier(build(directory))
        case .zeroShotSegmentation: try benchSegmentation(ZeroShotImageSegmentationPipeline(directory: directory.url))
        case .zeroShotObjectDetection: try benchDetection(ZeroShotObjectDetectionPipeline(directory: directory.url))
        case .imageToText:
            let pipeline = try ImageToTextPipeline(directory: directory.url)
            if let image, let prompt {
                guard let chat = try ImageTextToTextPipeline.chatting(with: pipeline, directory: directory.url) else {
                    throw Self.imageChatOnly
                }
                try benchImageTextToText(chat, image: image, prompt: prompt, precision: precision)
            } else {
                try benchImageToText(pipeline, precision: precision)
            }
        }
    }

    private struct ImageTextToTextReport: Encodable {
        let task = "image-text-to-text"
        let promptTokens: Int
        let imageMs: Double
        let firstTokenMs: Double
        let decodeTokensPerSecond: Double
        /// The precision the linear layers ran in.
        let dtype: MatrixPrecision

        enum CodingKeys: String, CodingKey {
            case task, promptTokens = "prompt_tokens", imageMs = "image_ms", firstTokenMs = "first_token_ms"
            case decodeTokensPerSecond = "decode_tokens_per_s", dtype
        }
    }

    /// One user turn holding the photo then the prompt, through the chat template (processed untimed), then per run:
    /// the image features (vision tower and projector: `image_ms`), the language model's prefill of the whole prompt
    /// to the first token (`first_token_ms`) and `newTokens - 1` greedy steps with no stop token. Medians of the runs,
    /// after one warm-up run.
    private func benchImageTextToText(_ pipeline: ImageTextToTextPipeline, image: String, prompt: String,
                                      precision: MatrixPrecision) throws {
        try cache.check(pipeline.text.model, path: options.model)
        let pipeline = try panAndScan.apply(to: pipeline)
        let processed = try pipeline.processor.preprocess([ImageDecoder.decode(contentsOf: URL(fileURLWithPath: image))])
        let messages: [JSONValue] = [["role": "user", "content": [["type": "image"], ["type": "text", "text": .string(prompt)]]]]
        let ids = try pipeline.promptIds(messages, imageTokenCounts: pipeline.processor.imageTokenCounts(processed))
        var config = pipeline.text.config
        config.doSample = false
        config.numBeams = 1
        config.maxNewTokens = newTokens
        config.eosTokenIds = []
        let model = pipeline.model
        func timedRun() throws -> (image: Double, firstToken: Double, decode: Double) {
            let start = DispatchTime.now().uptimeNanoseconds
            let features = try model.imageFeatures(processed)
            let featured = DispatchTime.now().uptimeNanoseconds
            var steps: [UInt64] = []
            _ = try model.textDecoder.generate(inputsEmbeds: model.inputsEmbeds(inputIds: ids, imageFeatures: features),
                                               promptIds: [ids], attentionMask: model.attentionMask(promptIds: ids).map { [$0] },
                                               config: config) { _ in steps.append(DispatchTime.now().uptimeNanoseconds) }
            guard let first = steps.first, let last = steps.last, steps.count == newTokens else {
                throw ValidationError("the benchmark answer stopped after \(steps.count) of \(newTokens) tokens")
            }
            let decode = newTokens > 1 ? Double(newTokens - 1) / (Double(last - first) / 1e9) : 0
            return (Double(featured - start) / 1e6, Double(first - featured) / 1e6, decode)
        }
        _ = try timedRun()
        var imageMs: [Double] = [], firstToken: [Double] = [], decode: [Double] = []
        for _ in 0..<runs {
            let times = try timedRun()
            imageMs.append(times.image)
            firstToken.append(times.firstToken)
            decode.append(times.decode)
        }
        let report = ImageTextToTextReport(promptTokens: ids.count, imageMs: imageMs.sorted()[runs / 2],
                                           firstTokenMs: firstToken.sorted()[runs / 2],
                                           decodeTokensPerSecond: decode.sorted()[runs / 2], dtype: precision)
        if json {
            try printJSON(report)
        } else {
            print(String(format: "image-text-to-text, %@: %d-token prompt, image %.1f ms, first token %.1f ms, decode %.1f tokens/s (%d tokens), median of %d runs",
                         precision.rawValue, report.promptTokens, report.imageMs, report.firstTokenMs, report.decodeTokensPerSecond, newTokens, runs))
        }
    }

    private struct ImageToTextReport: Encodable {
        let task = "image-to-text"
        let imageMs: Double
        let firstTokenMs: Double
        let decodeTokensPerSecond: Double
        let dtype: MatrixPrecision

        enum CodingKeys: String, CodingKey {
            case task, imageMs = "image_ms", firstTokenMs = "first_token_ms", decodeTokensPerSecond = "decode_tokens_per_s", dtype
        }
    }

    /// A 640×480 photo of seeded noise through the processor (untimed), then per run: the image features (vision
    /// tower and connector: `image_ms`), and a 20-token greedy caption with no stop token, whose first token comes
    /// after the language model's prefill (`first_token_ms`) and the other 19 one step each. Medians of the runs,
    /// after one warm-up run.
    private func benchImageToText(_ pipeline: ImageToTextPipeline, precision: MatrixPrecision) throws {
        try cache.check(pipeline.model, path: options.model)
        var generator = SeededGenerator(seed: 0x5EED)
        let photo = RGBImage(width: 640, height: 480, pixels: (0..<(640 * 480 * 3)).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let processed = try pipeline.processor.imageProcessor.preprocess([photo])
        var config = pipeline.config
        config.doSample = false
        config.numBeams = 1
        config.maxNewTokens = 20
        config.eosTokenIds = []
        func timedRun() throws -> (image: Double, firstToken: Double, decode: Double) {
            let start = DispatchTime.now().uptimeNanoseconds
            let embeddings = try pipeline.model.imageEmbeddings(processed)
            let embedded = DispatchTime.now().uptimeNanoseconds
            var steps: [UInt64] = []
            _ = try pipeline.model.generate(imageEmbeddings: embeddings, inputIds: nil, attentionMask: nil, config: config,
                                            stoppingCriteria: [], seed: 0) { _ in steps.append(DispatchTime.now().uptimeNanoseconds) }
            guard let first = steps.first, let last = steps.last, steps.count == 20 else {
                throw ValidationError("the benchmark caption stopped after \(steps.count) of 20 tokens")
            }
            return (Double(embedded - start) / 1e6, Double(first - embedded) / 1e6, 19 / (Double(last - first) / 1e9))
        }
        _ = try timedRun()
        var image: [Double] = [], firstToken: [Double] = [], decode: [Double] = []
        for _ in 0..<runs {
            let times = try timedRun()
            image.append(times.image)
            firstToken.append(times.firstToken)
            decode.append(times.decode)
        }
        let report = ImageToTextReport(imageMs: image.sorted()[runs / 2], firstTokenMs: firstToken.sorted()[runs / 2],
                                       decodeTokensPerSecond: decode.sorted()[runs / 2], dtype: precision)
        if json {
            try printJSON(report)
        } else {
            print(String(format: "image-to-text: image %.1f ms, first token %.1f ms, decode %.1f tokens/s (20-token caption), median of %d runs",
                         report.imageMs, report.firstTokenMs, report.decodeTokensPerSecond, runs))
        }
    }

    private struct PromptedImageReport: Encodable {
        let task: String
        let msPerItem: Double
        let labels: Int

        enum CodingKeys: String, CodingKey { case task, msPerItem = "ms_per_item", labels }
    }

    /// 640×480 seeded noise, the photo the prompted benchmarks look at.
    private func noisePhoto() -> RGBImage {
        var generator = SeededGenerator(seed: 0x5EED)
        return RGBImage(width: 640, height: 480, pixels: (0..<(640 * 480 * 3)).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// `count` distinct short labels, the same ones scripts/bench_vision.py gives PyTorch and ONNX Runtime.
    private func benchLabels(_ count: Int) -> [String] {
        (0..<count).map { "a photo of object number \($0 + 1)" }
    }

    /// The median of `runs` timed calls of `work`, in ms, after one untimed warm-up call.
    private func medianMs(_ work: () throws -> Void) throws -> Double {
        try work()
        var times: [Double] = []
        for _ in 0..<runs {
            let start = DispatchTime.now().uptimeNanoseconds
            try work()
            times.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        }
        return times.sorted()[runs / 2]
    }

    private func printPromptedReport(_ report: PromptedImageReport) throws {
        if json {
            try printJSON(report)
        } else {
            print(String(format: "%@: %.1f ms per 640×480 image with %d labels, median of %d runs", report.task, report.msPerItem, report.labels, runs))
        }
    }

    /// The noise photo and `labels` text prompts through the processor (untimed), then per run what the pipeline
    /// does with them: the prompts' conditional embeddings, the segmentation logits (the vision tower reads the
    /// photo once for all prompts) and the probability maps resized to the photo.
    private func benchSegmentation(_ pipeline: ZeroShotImageSegmentationPipeline) throws {
        let photo = noisePhoto()
        let text = try pipeline.processor.textInputs(benchLabels(labels))
        let pixels = try pipeline.processor.pixelValues([photo])
        let model = pipeline.model
        let ms = try medianMs {
            let embeddings = try model.conditionalEmbeddings(inputIds: text.ids, attentionMask: text.attentionMask)
            let logits = try model.segmentationLogits(pixelValues: pixels, conditionalEmbeddings: embeddings)
            _ = interpolate(activation(logits, .sigmoid), height: photo.height, width: photo.width, mode: .bilinear)
        }
        try printPromptedReport(PromptedImageReport(task: "zero-shot-image-segmentation", msPerItem: ms, labels: labels))
    }

    /// The noise photo and `labels` text queries through the processor (untimed; OWLv2's pads and resizes it to its
    /// square), then per run the detector's logits, boxes (and objectness) and the scores' sigmoids.
    private func benchDetection(_ pipeline: ZeroShotObjectDetectionPipeline) throws {
        let text = try pipeline.processor.textInputs(benchLabels(labels))
        let pixels = try pipeline.processor.pixelValues([noisePhoto()])
        let model = pipeline.model
        let ms = try medianMs {
            let output = try model.detect(pixelValues: pixels, inputIds: text.ids, attentionMask: text.attentionMask)
            _ = activation(output.logits, .sigmoid)
        }
        try printPromptedReport(PromptedImageReport(task: "zero-shot-object-detection", msPerItem: ms, labels: labels))
    }

    private struct QuestionReport: Encodable {
        let task = "visual-question-answering"
        let msPerItem: Double

        enum CodingKeys: String, CodingKey { case task, msPerItem = "ms_per_item" }
    }

    /// A classifying VQA model (ViLT) on random pixel values at its processor's usual size, 384×640, and a 12-token
    /// question: the whole forward pass per image.
    private func benchQuestionClassifier(_ model: any VisualQuestionClassifier) throws {
        var generator = SeededGenerator(seed: 0x5EED)
        let pixels = Tensor(shape: [1, 3, 384, 640], scalars: (0..<(3 * 384 * 640)).map { _ in Float.random(in: -1...1, using: &generator) })
        let question = [Array(100..<112)]
        _ = try model.logits(pixelValues: pixels, pixelMask: nil, inputIds: question, attentionMask: nil)
        var times: [Double] = []
        for _ in 0..<runs {
            let start = DispatchTime.now().uptimeNanoseconds
            _ = try model.logits(pixelValues: pixels, pixelMask: nil, inputIds: question, attentionMask: nil)
            times.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        }
        let report = QuestionReport(msPerItem: times.sorted()[runs / 2])
        if json {
            try printJSON(report)
        } else {
            print(String(format: "visual-question-answering: %.2f ms per image (384×640, 12-token question), median of %d runs", report.msPerItem, runs))
        }
    }

    /// The image side of a model: `features` of random pixel values `[batch, 3, side, side]`.
    /// A batch of pixel values [batch, 3, side, side] drawn uniformly from [-2, 2].
    private func randomPixels(side: Int) -> Tensor {
        // Seeded: the system generator makes a system call per number, seconds for a batch of 32 images.
        var generator = SeededGenerator(seed: 0x5EED)
        return Tensor(shape: [batchSize, 3, side, side],
                      scalars: (0..<(batchSize * 3 * side * side)).map { _ in Float.random(in: -2...2, using: &generator) })
    }

    private func benchImageModel(precision: MatrixPrecision, features: () throws -> Tensor) throws {
        _ = try features()
        var times: [Double] = []
        for _ in 0..<runs {
            let start = DispatchTime.now().uptimeNanoseconds
            _ = try features()
            times.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        }
        let median = times.sorted()[times.count / 2] / Double(batchSize)
        if json {
            try printJSON(ImageReport(batchSize: batchSize, msPerItem: median, dtype: precision))
        } else {
            print("image-embedding, batch \(batchSize), \(precision.rawValue): \(String(format: "%.2f", median)) ms per image (median of \(runs) runs)")
        }
    }

    /// Prefills a prompt of fixed pseudo-random token ids through a KV cache, then feeds back the greedy token
    /// `newTokens` times (no stop token); one untimed warm-up run creates the primitives for every shape first.
    private func benchLanguageModel(_ model: any CausalLanguageModel, precision: MatrixPrecision) throws {
        try cache.check(model, path: options.model)
        var state: UInt64 = 0x5EED
        let prompt = (0..<promptTokens).map { _ in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int(state >> 33) % model.vocabularySize
        }
        func timedRun() throws -> (prefill: Double, decode: Double) {
            let cache = try model.makeCache(batch: 1, capacity: promptTokens + newTokens)
            let start = DispatchTime.now().uptimeNanoseconds
            var logits = try model.logits(inputIds: [prompt], cache: cache, lastPositionOnly: true)
            var token = argmaxLastDimension(logits)[0]
            let prefilled = DispatchTime.now().uptimeNanoseconds
            for _ in 0..<newTokens {
                logits = try model.logits(nextToken: token, cache: cache)
                token = argmax(UnsafeBufferPointer(start: logits.storage.pointer, count: logits.count))
            }
            let end = DispatchTime.now().uptimeNanoseconds
            return (Double(prefilled - start) / 1e9, Double(end - prefilled) / 1e9)
        }
        _ = try timedRun()
        var prefill: [Double] = [], decode: [Double] = []
        for _ in 0..<runs {
            let times = try timedRun()
            prefill.append(times.prefill)
            decode.append(times.decode)
        }
        let report = TextReport(promptTokens: promptTokens, newTokens: newTokens,
                                prefillTokensPerSecond: Double(promptTokens) / prefill.sorted()[runs / 2],
                                decodeTokensPerSecond: Double(newTokens) / decode.sorted()[runs / 2], dtype: precision,
                                cacheType: model.cacheElementType.rawValue)
        if json {
            try printJSON(report)
        } else {
            print(String(format: "text-generation, %@, %@ KV cache: prefill %.1f tokens/s (%d-token prompt), decode %.1f tokens/s (%d tokens), median of %d runs",
                         precision.rawValue, report.cacheType, report.prefillTokensPerSecond, promptTokens,
                         report.decodeTokensPerSecond, newTokens, runs))
        }
    }
}
