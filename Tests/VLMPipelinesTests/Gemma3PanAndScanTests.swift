import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTemplates
import VLMTensor

/// Gemma 3's pan and scan against transformers' `Gemma3Processor(..., do_pan_and_scan=True)` through oracle/gemma3.py's
/// tiny checkpoint (oracle/gemma3_pan_and_scan.py): which photos are cut into how many crops, the crops' pixels as
/// Pillow resizes them, the prompt that names an image and its crops, and the model over all of them, from its image
/// features to greedy answers in single requests, conversations and a session.
@Suite struct Gemma3PanAndScanTests {
    struct Expected: Decodable {
        struct Settings: Decodable {
            let pan_and_scan_min_crop_size: Int?
            let pan_and_scan_max_num_crops: Int?
            var panAndScan: PanAndScan {
                PanAndScan(minCropSize: pan_and_scan_min_crop_size ?? 256, maxCrops: pan_and_scan_max_num_crops ?? 4)
            }
        }
        struct Photo: Decodable { let image: String; let num_crops: Int; let views: [String]? }
        struct Crops: Decodable { let settings: Settings; let photos: [Photo] }
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable {
            let settings: Settings
            let images: [String]
            let prompt: String
            let num_crops: [Int]
            let input_ids: [Int]
            let token_type_ids: [Int]
            let image_features: [[[Float]]]
            let logits_positions: [Int]
            let logits: [[Float]]
            let greedy: Generated
        }
        struct Answer: Decodable { let prompt: String; let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Turn: Decodable { let images: [String]; let text: String; let input_ids: [Int]; let ids: [Int]; let answer: String }
        let crops: [Crops]
        let requests: [Request]
        let chat: Answer
        let session: [Turn]
    }

    static let directory = Gemma3PipelineTests.directory
    static let chatTokens = 8, newTokens = 10

    static func maxDifference(_ a: [Float], _ b: [Float]) -> Float {
        a.count == b.count ? zip(a, b).map { abs($0 - $1) }.max() ?? 0 : .infinity
    }

    static func load() throws -> (Expected, [JSONValue]) {
        let data = try Data(contentsOf: Gemma3PipelineTests.fixtures.appendingPathComponent("gemma3/pan-and-scan.json"))
        guard case let .array(messages)? = try JSONValue(parsing: data)["chat"]?["messages"] else { throw CocoaError(.fileReadCorruptFile) }
        let absolute = messages.map {
            ImageChatTests.withImagePaths($0) { .string(Gemma3PipelineTests.fixtures.appendingPathComponent($0).path) }
        }
        return (try JSONDecoder().decode(Expected.self, from: data), absolute)
    }

    static func processor(_ settings: Expected.Settings) throws -> Gemma3Processor {
        var processor = try Gemma3Processor(directory: ModelDirectory(url: directory))
        processor.panAndScan = settings.panAndScan
        return processor
    }

    /// How many crops each photo gives, and every view (the photo, then its crops, the last cut short by the photo's
    /// edge in chelsea.png and tall.png) resized to the bytes Pillow gives before rescaling.
    @Test func cropsPhotosAndResizesThemLikeTransformers() throws {
        let (expected, _) = try Self.load()
        let settings = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: Self.directory.appendingPathComponent("processor_config.json"))) as? [String: Any])
        var config = try StandardImageProcessorConfig(
            json: JSONSerialization.data(withJSONObject: try #require(settings["image_processor"])), defaults: .vit)
        (config.doRescale, config.doNormalize) = (false, false)
        let bytes = StandardImageProcessor(config: config)
        var viewed = 0
        for setting in expected.crops {
            for photo in setting.photos {
                let image = try Gemma3PipelineTests.photos([photo.image])[0]
                let crops = try setting.settings.panAndScan.crops(of: image)
                #expect(crops.count == photo.num_crops, "\(photo.image) \(setting.settings.panAndScan)")
                guard let views = photo.views else { continue }
                let pixels = try bytes.preprocess([image] + crops).pixelValues
                #expect(pixels.shape == [views.count, 3, 32, 32], "\(photo.image)")
                let expectedPixels = views.flatMap { Data(base64Encoded: $0).map { $0.map(Float.init) } ?? [] }
                #expect(pixels.scalars == expectedPixels, "\(photo.image)")
                viewed += 1
            }
        }
        #expect(viewed == 3)
    }

    /// transformers' own `test_pan_and_scan` (tests/models/gemma3/test_image_processing_gemma3.py): under its tester's
    /// settings (crops of at least 10 pixels, at most 2, from a ratio of 1.2) a 600×300 image is read whole and as 2
    /// crops, and its square test images are not cut.
    @Test func upstreamPanAndScanTestHolds() throws {
        let settings = PanAndScan(minCropSize: 10, maxCrops: 2, minRatioToActivate: 1.2)
        let wide = RGBImage(width: 600, height: 300, pixels: Array(repeating: 7, count: 600 * 300 * 3))
        #expect(try settings.crops(of: wide).map { [$0.width, $0.height] } == [[300, 300], [300, 300]])
        #expect(settings.cropRectangles(width: 400, height: 400).isEmpty)
    }

    /// The prompt names each image and its crops ("Here is the original image …"), and the pixel values hold each
    /// image's views after it.
    @Test func processorWritesImagesAndCropsLikeTransformers() throws {
        let (expected, _) = try Self.load()
        for request in expected.requests {
            let processor = try Self.processor(request.settings)
            let images = try processor.preprocess(Gemma3PipelineTests.photos(request.images))
            #expect(images.crops == request.num_crops)
            #expect(images.pixelValues.shape[0] == request.images.count + request.num_crops.reduce(0, +))
            #expect(try processor.promptIds(request.prompt, images: images) == request.input_ids, "\(request.images)")
        }
    }

    /// Image features (an image's rows, then its crops'), logits with the image blocks' mask (each view's tokens see
    /// each other) and greedy continuations.
    @Test func modelReadsImagesAndCropsLikeTransformers() throws {
        let (expected, _) = try Self.load()
        let model = try Gemma3ForConditionalGeneration(directory: ModelDirectory(url: Self.directory))
        let vocabulary = model.vocabularySize
        for request in expected.requests {
            let images = try Self.processor(request.settings).preprocess(Gemma3PipelineTests.photos(request.images))
            let features = try model.imageFeatures(images)
            #expect(features.map { $0.shape[0] } == request.num_crops.map { 16 * (1 + $0) })
            #expect(Self.maxDifference(features.flatMap(\.scalars), request.image_features.flatMap { $0.flatMap { $0 } }) < 1e-4)
            let mask = try #require(model.attentionMask(promptIds: request.input_ids))
            #expect(mask.map { $0 >= 2 ? 1 : 0 } == request.token_type_ids)
            let embeds = try model.inputsEmbeds(inputIds: request.input_ids, imageFeatures: features)
            let logits = try model.languageModel.logits(inputsEmbeds: embeds, attentionMask: [mask], positionIds: nil,
                                                        cache: nil, lastPositionOnly: false).scalars
            for (position, expectedRow) in zip(request.logits_positions, request.logits) {
                let row = Array(logits[(position * vocabulary)..<((position + 1) * vocabulary)])
                #expect(Self.maxDifference(row, expectedRow) < 1e-4, "\(request.images) position \(position)")
            }
        }
    }

    /// `ImageToTextPipeline.withPanAndScan` answers plain prompts as transformers generates them, images with
    /// different numbers of crops one at a time.
    @Test func asksWithPanAndScanLikeTransformers() throws {
        let (expected, _) = try Self.load()
        let plain = try ImageToTextPipeline(directory: Self.directory)
        for request in expected.requests where !request.prompt.hasPrefix("<bos>") && request.images.count == 1 {
            let pipeline = try plain.withPanAndScan(request.settings.panAndScan)
            let results = try pipeline(Gemma3PipelineTests.photos(request.images), prompt: request.prompt,
                                       settings: Gemma3PipelineTests.greedy(pipeline.config, tokens: Self.newTokens))
            #expect(results.map(\.ids) == [request.greedy.ids], "\(request.images)")
            #expect(results.map(\.text) == [request.greedy.text], "\(request.images)")
        }
    }

    /// A conversation through the chat template, and a session turn by turn over one KV cache.
    @Test func chatsWithPanAndScanLikeTransformers() throws {
        let (expected, messages) = try Self.load()
        let pipeline = try ImageTextToTextPipeline(directory: Self.directory).withPanAndScan()
        let settings = Gemma3PipelineTests.greedy(pipeline.text.config, tokens: Self.chatTokens)
        let result = try pipeline.generate(messages: messages, settings: settings)
        #expect(result.promptTokens == expected.chat.input_ids)
        #expect(result.ids == expected.chat.ids && result.text == expected.chat.text)
        let session = try ChatSession(pipeline: pipeline)
        for (index, turn) in expected.session.enumerated() {
            let answer = try session.send(turn.text, images: Gemma3PipelineTests.photos(turn.images), settings: settings)
            #expect(answer.promptTokens == turn.input_ids, "turn \(index)")
            #expect(answer.ids == turn.ids && answer.text == turn.answer, "turn \(index)")
        }
    }

    /// transformers' processor passes its own call-time settings over a config's pan-and-scan keys (the oracle
    /// checks it): a config that turns it on changes nothing.
    @Test func configPanAndScanKeysChangeNothing() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gemma3-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            try FileManager.default.copyItem(at: Self.directory.appendingPathComponent(file), to: directory.appendingPathComponent(file))
        }
        let settings = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: Self.directory.appendingPathComponent("processor_config.json"))) as? [String: Any])
        var imageProcessor = try #require(settings["image_processor"] as? [String: Any])
        imageProcessor.merge(["do_pan_and_scan": true, "pan_and_scan_min_crop_size": 64, "pan_and_scan_max_num_crops": 3,
                              "pan_and_scan_min_ratio_to_activate": 1.2]) { $1 }
        var changed = settings
        changed["image_processor"] = imageProcessor
        try JSONSerialization.data(withJSONObject: changed).write(to: directory.appendingPathComponent("processor_config.json"))
        let configured = try Gemma3Processor(directory: ModelDirectory(url: directory))
        let plain = try Gemma3Processor(directory: ModelDirectory(url: Self.directory))
        let wide = try Gemma3PipelineTests.photos(["llava-next/photos/wide.png"])
        let (ours, theirs) = (try configured.preprocess(wide), try plain.preprocess(wide))
        #expect(ours.crops == nil && ours.pixelValues.scalars == theirs.pixelValues.scalars)
    }

    @Test func panAndScanIsGemma3s() throws {
        let llava = try ImageToTextPipeline(directory: Gemma3PipelineTests.fixtures.appendingPathComponent("llava/llama-default-fp16"))
        let error = try #require(throws: PipelineError.self) { try llava.withPanAndScan() }
        #expect(error.description.contains("Gemma 3") && !error.description.contains("\n"))
    }
}
