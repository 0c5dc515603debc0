import Foundation
import Testing
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// Image to text from files, as a user meets it: checkpoint, real tokenizer and processor config as transformers
/// saves them, real photos; against what transformers' processor, generate and decoding gave
/// (oracle/image_to_text.py).
@Suite struct ImageToTextTests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable {
            let image: String
            let prompt: String?
            let input_ids: [Int]?
            let greedy: Generated
            let beam: Generated
        }
        let max_new_tokens: Int
        let requests: [Request]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    static func load(_ name: String, task: ModelTask = .caption) throws -> (ImageToTextPipeline, Expected) {
        let directory = fixtures.appendingPathComponent("image-to-text/\(name)")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        return (try ImageToTextPipeline(directory: directory, task: task), expected)
    }

    static func photo(_ name: String) throws -> RGBImage {
        try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent("photos/\(name)"))
    }

    /// `--dtype` serves the image-to-text families too: built in bf16 or int8, a model's image embeddings (what its
    /// language model conditions on) stay at cosine ≥ 0.9995 (bf16) and ≥ 0.995 (int8) to its fp32 ones.
    @Test(arguments: ["blip2-opt", "blip2-flan-t5", "blip-captioning"], [(MatrixPrecision.bfloat16, Float(0.9995)), (.int8, 0.995)])
    func lowerPrecisionKeepsImageEmbeddings(_ name: String, _ precision: (MatrixPrecision, Float)) throws {
        let directory = Self.fixtures.appendingPathComponent("image-to-text/\(name)")
        let fp32 = try ImageToTextPipeline(directory: directory)
        let low = try MatrixPrecision.$forNewLayers.withValue(precision.0) { try ImageToTextPipeline(directory: directory) }
        let images = try fp32.processor.imageProcessor.preprocess([try Self.photo("chelsea.png")])
        let (a, b) = (try low.model.imageEmbeddings(images).scalars, try fp32.model.imageEmbeddings(images).scalars)
        let dot = zip(a, b).reduce(0) { $0 + $1.0 * $1.1 }
        let cosine = dot / (a.reduce(0) { $0 + $1 * $1 }.squareRoot() * b.reduce(0) { $0 + $1 * $1 }.squareRoot())
        #expect(cosine >= precision.1, "\(name) \(precision.0): cosine \(cosine)")
        if precision.0.available != .float32 { #expect(a != b) }
    }

    @Test(arguments: ["blip2-opt", "blip2-flan-t5", "blip2-t5-bf16", "blip-captioning", "blip-vqa"])
    func processorsLayOutPromptsLikeTransformers(_ name: String) throws {
        let (pipeline, expected) = try Self.load(name, task: name == "blip-vqa" ? .ask : .caption)
        for request in expected.requests {
            #expect(try pipeline.processor.promptIds(request.prompt) == request.input_ids, "\(request.prompt ?? "no prompt")")
        }
    }

    @Test(arguments: [("blip2-opt", "greedy"), ("blip2-opt", "beam"), ("blip2-flan-t5", "greedy"), ("blip2-flan-t5", "beam"),
                      ("blip2-t5-bf16", "greedy"), ("blip2-t5-bf16", "beam"),
                      ("blip-captioning", "greedy"), ("blip-captioning", "beam")])
    func captionsAndContinuationsLikeTransformers(_ name: String, _ mode: String) throws {
        let (pipeline, expected) = try Self.load(name)
        var settings = pipeline.config
        settings.maxNewTokens = expected.max_new_tokens
        settings.doSample = false
        settings.numBeams = mode == "beam" ? 3 : 1
        for request in expected.requests {
            let result = try pipeline([try Self.photo(request.image)], prompt: request.prompt, settings: settings)[0]
            let reference = mode == "beam" ? request.beam : request.greedy
            #expect(result.ids == reference.ids, "\(request.image) \(request.prompt ?? "no prompt")")
            #expect(result.text == reference.text)
        }
    }

    @Test func imagesOfABatchAreCaptionedAsAlone() throws {
        let (pipeline, expected) = try Self.load("blip2-opt")
        var settings = pipeline.config
        settings.maxNewTokens = expected.max_new_tokens
        let uncaptioned = expected.requests.filter { $0.prompt == nil }
        let results = try pipeline(uncaptioned.map { try Self.photo($0.image) }, settings: settings)
        #expect(results.map(\.ids) == uncaptioned.map(\.greedy.ids))
    }

    @Test func visualQuestionsUseBlip2sQuestionForm() throws {
        let (pipeline, expected) = try Self.load("blip2-opt")
        let request = try #require(expected.requests.first { $0.prompt?.hasPrefix("Question: ") == true })
        let question = String(request.prompt!.dropFirst("Question: ".count).dropLast(" Answer:".count))
        var settings = pipeline.config
        settings.maxNewTokens = expected.max_new_tokens
        let answers = try VisualQuestionAnsweringPipeline(generator: pipeline)([try Self.photo(request.image)], question: question,
                                                                                settings: settings)
        #expect(answers.map { $0.map(\.ids) } == [[request.greedy.ids]])
    }

    @Test(arguments: ["greedy", "beam"])
    func blipAnswersQuestionsLikeTransformers(_ mode: String) throws {
        let directory = Self.fixtures.appendingPathComponent("image-to-text/blip-vqa")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let pipeline = try VisualQuestionAnsweringPipeline(directory: directory)
        var settings = try #require(pipeline.generationConfig)
        settings.maxNewTokens = expected.max_new_tokens
        settings.numBeams = mode == "beam" ? 3 : 1
        for request in expected.requests {
            let answers = try pipeline([try Self.photo(request.image)], question: request.prompt!, settings: settings)[0]
            let reference = mode == "beam" ? request.beam : request.greedy
            #expect(answers.count == 1)
            #expect(answers.first?.ids == reference.ids, "\(request.prompt!)")
            #expect(answers.first?.answer == reference.text)
        }
    }

    /// BLIP's `BlipForImageTextRetrieval` and BLIP-2's `Blip2ForImageTextRetrieval`.
    @Test(arguments: ["blip-retrieval", "blip2-retrieval"])
    func retrievalScoresEveryPairLikeTransformers(_ name: String) throws {
        struct Retrieval: Decodable {
            struct Pair: Decodable { let image: String; let text: String; let itm: Float; let itc: Float }
            let texts: [String]
            let pairs: [Pair]
        }
        let directory = Self.fixtures.appendingPathComponent("image-to-text/\(name)")
        let expected = try JSONDecoder().decode(Retrieval.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let pipeline = try ImageTextMatchingPipeline(directory: directory)
        let photos = ["chelsea.png", "coffee.png"]
        let results = try pipeline(photos.map(Self.photo), texts: expected.texts).flatMap { $0 }
        try #require(results.count == expected.pairs.count)
        for (result, pair) in zip(results, expected.pairs) {
            #expect(result.text == pair.text)
            #expect(abs(result.itm - pair.itm) < 1e-4, "\(pair.image) \(pair.text)")
            #expect(abs(result.itc - pair.itc) < 1e-4, "\(pair.image) \(pair.text)")
        }
    }

    @Test func chatCarriesEarlierTurnsAndDropsTheOldest() throws {
        let (pipeline, _) = try Self.load("blip2-opt")
        var settings = pipeline.config
        settings.maxNewTokens = 3
        let session = try VisualChatSession(pipeline: pipeline, image: try Self.photo("chelsea.png"), maximumPromptTokens: 40)
        let first = try session.ask("what is this?", settings: settings)
        // The second prompt holds the first turn; its answer is what a single prompt with that text gives.
        let second = try session.ask("and its colour?", settings: settings)
        let prompt = "Question: what is this? Answer: \(first.text). Question: and its colour? Answer:"
        #expect(try pipeline([try Self.photo("chelsea.png")], prompt: prompt, settings: settings)[0].ids == second.ids)
        // A long third question leaves no room for the first turns: they are dropped.
        let question = Array(repeating: "why", count: 20).joined(separator: " ")
        let third = try session.ask(question, settings: settings)
        #expect(try pipeline([try Self.photo("chelsea.png")], prompt: "Question: \(question) Answer:", settings: settings)[0].ids == third.ids)
        #expect(session.turns.count == 3)
        #expect(throws: PipelineError.self) { try session.ask(Array(repeating: "why", count: 60).joined(separator: " "), settings: settings) }
    }

    @Test func otherFamiliesAreRefusedNamingTheirCommands() throws {
        let clip = Self.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        let error = try #require(throws: ModelError.self) { try ImageToTextPipeline(directory: clip) }
        #expect(error.description.contains("cannot run `vlm caption`; it runs with vlm classify, vlm embed, vlm match"))
    }
}
