import Foundation
import Testing
import VLMTensor

/// `vlm caption`, `vlm ask`, `vlm chat --image` and `vlm bench` on a BLIP-2 checkpoint with a real tokenizer, against
/// oracle/image_to_text.py; `vlm caption` on a LLaVA-NeXT checkpoint, against oracle/llava_next.py.
@Suite struct ImageToTextCLITests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable { let image: String; let prompt: String?; let greedy: Generated }
        let requests: [Request]
    }

    let model = CLI.fixtures.appendingPathComponent("image-to-text/blip2-opt").path
    var expected: Expected {
        get throws {
            try JSONDecoder().decode(Expected.self, from: Data(contentsOf: URL(fileURLWithPath: model).appendingPathComponent("expected.json")))
        }
    }

    func photo(_ name: String) -> String { CLI.fixtures.appendingPathComponent("photos/\(name)").path }

    @Test func captionPrintsEachImagesTextAndNewIds() throws {
        let requests = try expected.requests.filter { $0.prompt == nil }
        let run = try CLI.run(["caption"] + requests.map { photo($0.image) } + ["--model", model, "--max-new-tokens", "12", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(output.count == requests.count)
        for (entry, request) in zip(output, requests) {
            #expect(Set(entry.keys) == ["image", "text", "ids"])
            #expect(entry["image"] as? String == photo(request.image))
            #expect(entry["ids"] as? [Int] == request.greedy.ids)
            #expect(entry["text"] as? String == request.greedy.text)
        }
        let plain = try CLI.run(["caption", photo(requests[0].image), "--model", model, "--max-new-tokens", "12"])
        #expect(plain.stdout == "\(photo(requests[0].image)): \(requests[0].greedy.text)\n")
    }

    /// Flan-T5 BLIP-2 captions without a prompt: its encoder reads the image tokens alone.
    @Test func flanT5CaptionsWithoutAPrompt() throws {
        let flan = CLI.fixtures.appendingPathComponent("image-to-text/blip2-flan-t5").path
        let requests = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: URL(fileURLWithPath: flan).appendingPathComponent("expected.json")))
            .requests.filter { $0.prompt == nil }
        let run = try CLI.run(["caption"] + requests.map { photo($0.image) } + ["--model", flan, "--max-new-tokens", "12", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(output.map { $0["ids"] as? [Int] } == requests.map(\.greedy.ids))
        #expect(output.map { $0["text"] as? String } == requests.map(\.greedy.text))
    }

    @Test func promptedCaptionIsTheContinuationOnly() throws {
        let request = try #require(try expected.requests.first { $0.prompt == "a photo of" })
        let run = try CLI.run(["caption", photo(request.image), "--model", model, "--prompt", "a photo of",
                               "--max-new-tokens", "12", "--temperature", "0", "--json"])
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(output.first?["ids"] as? [Int] == request.greedy.ids)
        #expect(output.first?["text"] as? String == request.greedy.text)
    }

    @Test func askAnswersInBlip2sQuestionForm() throws {
        let request = try #require(try expected.requests.first { $0.prompt?.hasPrefix("Question:") == true })
        let run = try CLI.run(["ask", photo(request.image), "--model", model, "--question", "what is in the cup?",
                               "--max-new-tokens", "12", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(Set(output.first?.keys ?? [:].keys) == ["image", "question", "answers"])
        #expect(output.first?["question"] as? String == "what is in the cup?")
        let answers = try #require(output.first?["answers"] as? [[String: Any]])
        #expect(answers.count == 1)
        #expect(answers.first?["ids"] as? [Int] == request.greedy.ids)
        #expect(answers.first?["answer"] as? String == request.greedy.text)
    }

    @Test func chatAboutAnImageAnswersEachLine() throws {
        let request = try #require(try expected.requests.first { $0.prompt?.hasPrefix("Question:") == true })
        let input = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-chat-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data("what is in the cup?\n".utf8).write(to: input)
        let run = try CLI.run(["chat", "--model", model, "--image", photo(request.image), "--max-new-tokens", "12"],
                              standardInput: input)
        #expect(run.status == 0, "\(run.stderr)")
        // The first question has no earlier turns: the same prompt as `vlm ask`.
        #expect(run.stdout == request.greedy.text + "\n")
    }

    /// LLaVA-NeXT (oracle/llava_next.py): photos of different aspect ratios, so of different image token counts,
    /// captioned in one call.
    @Test func llavaNextCaptionsImagesOfDifferentSizes() throws {
        let next = CLI.fixtures.appendingPathComponent("llava-next/llama-tied-fp16")
        struct Request: Decodable { let images: [String]; let prompt: String; let greedy: Expected.Generated }
        struct Requests: Decodable { let requests: [Request] }
        let requests = try JSONDecoder().decode(Requests.self, from: Data(contentsOf: next.appendingPathComponent("expected.json"))).requests
        let images = requests.map { CLI.fixtures.appendingPathComponent($0.images[0]).path }
        let run = try CLI.run(["caption"] + images + ["--model", next.path, "--prompt", requests[0].prompt,
                                                    "--max-new-tokens", "10", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(output.map { $0["image"] as? String } == images)
        #expect(output.map { $0["ids"] as? [Int] } == requests.map(\.greedy.ids))
        #expect(output.map { $0["text"] as? String } == requests.map(\.greedy.text))
    }

    @Test func blipCaptionsAnswersAndMatches() throws {
        let captioning = CLI.fixtures.appendingPathComponent("image-to-text/blip-captioning").path
        let run = try CLI.run(["caption", photo("chelsea.png"), "--model", captioning, "--prompt", "a picture of",
                               "--max-new-tokens", "12", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let caption = try #require(try CLI.json(run) as? [[String: Any]])
        let expectedCaption = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: URL(fileURLWithPath: captioning).appendingPathComponent("expected.json")))
            .requests.first { $0.prompt == "a picture of" }
        #expect(caption.first?["ids"] as? [Int] == expectedCaption?.greedy.ids)

        let vqa = CLI.fixtures.appendingPathComponent("image-to-text/blip-vqa").path
        let expectedAnswer = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: URL(fileURLWithPath: vqa).appendingPathComponent("expected.json")))
            .requests.first { $0.image == "coffee.png" }
        let asked = try CLI.run(["ask", photo("coffee.png"), "--model", vqa, "--question", "what is in the cup?",
                                 "--max-new-tokens", "12", "--json"])
        let answers = try #require((try CLI.json(asked) as? [[String: Any]])?.first?["answers"] as? [[String: Any]])
        #expect(answers.first?["answer"] as? String == expectedAnswer?.greedy.text)

        let retrieval = CLI.fixtures.appendingPathComponent("image-to-text/blip-retrieval").path
        let matched = try CLI.run(["match", photo("chelsea.png"), photo("coffee.png"), "--model", retrieval,
                                   "--texts", "a cat lying on a blanket,a cup of coffee", "--json"])
        #expect(matched.status == 0, "\(matched.stderr)")
        let pairs = try #require(try CLI.json(matched) as? [[String: Any]])
        #expect(pairs.map { $0["text"] as? String } == ["a cat lying on a blanket", "a cup of coffee", "a cat lying on a blanket", "a cup of coffee"])
        #expect(pairs.map { $0["image"] as? String } == [photo("chelsea.png"), photo("chelsea.png"), photo("coffee.png"), photo("coffee.png")])
        #expect(pairs.allSatisfy { Set($0.keys) == ["image", "text", "itm", "itc"] })
        // BLIP-2's retrieval checkpoint scores as transformers does (oracle/image_to_text.py).
        let blip2 = CLI.fixtures.appendingPathComponent("image-to-text/blip2-retrieval").path
        let scored = try CLI.run(["match", photo("coffee.png"), "--model", blip2, "--texts", "a cup of coffee", "--json"])
        #expect(scored.status == 0, "\(scored.stderr)")
        let score = try #require((try CLI.json(scored) as? [[String: Any]])?.first)
        let reference = try #require(((try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: blip2).appendingPathComponent("expected.json"))) as? [String: Any])?["pairs"] as? [[String: Any]])?
            .first { $0["image"] as? String == "coffee.png" && $0["text"] as? String == "a cup of coffee" })
        for key in ["itm", "itc"] {
            let (actual, wanted) = (try #require(score[key] as? Double), try #require(reference[key] as? Double))
            #expect(abs(actual - wanted) < 1e-4, "\(key)")
        }
        // The BLIP-2 checkpoint does not match images and texts: the one-line error names what it runs.
        let wrong = try CLI.run(["match", photo("chelsea.png"), "--model", model, "--texts", "a"])
        #expect(wrong.status == 1 && wrong.stderr.contains("it runs with vlm caption, vlm ask, vlm chat"))
    }

    /// --logits writes each image's first-step logits as float32 .npy `[images, vocabulary]`; each row's best token
    /// is the first token transformers generated for that image.
    @Test func captionWritesTheFirstStepLogits() throws {
        let requests = try expected.requests.filter { $0.prompt == nil }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-logits-\(UUID().uuidString).npy")
        defer { try? FileManager.default.removeItem(at: file) }
        let arguments = ["caption"] + requests.map { photo($0.image) } + ["--model", model, "--max-new-tokens", "2", "--logits", file.path]
        let run = try CLI.run(arguments)
        #expect(run.status == 0, "\(run.stderr)")
        let bytes = [UInt8](try Data(contentsOf: file))
        #expect(Array(bytes[0..<8]) == [0x93] + Array("NUMPY".utf8) + [1, 0])
        let headerLength = Int(bytes[8]) | Int(bytes[9]) << 8
        let header = String(decoding: bytes[10..<(10 + headerLength)], as: UTF8.self)
        let values = bytes[(10 + headerLength)...].withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
        let vocabulary = values.count / requests.count
        #expect(header.contains("'descr': '<f4'") && header.contains("'shape': (\(requests.count), \(vocabulary))"), "\(header)")
        for (index, request) in requests.enumerated() {
            let row = values[(index * vocabulary)..<((index + 1) * vocabulary)]
            #expect(row.indices.max { row[$0] < row[$1] }.map { $0 - index * vocabulary } == request.greedy.ids.first)
        }
        let again = try CLI.run(arguments)
        #expect(again.status == 1 && again.stderr.contains("exists"), "\(again.stderr)")
        let beams = try CLI.run(["caption", photo(requests[0].image), "--model", model, "--num-beams", "3", "--logits", file.path + "2"])
        #expect(beams.status == 1 && beams.stderr.contains("--num-beams 1"), "\(beams.stderr)")
    }

    @Test func benchReportsImageFirstTokenAndDecodeTimes() throws {
        let run = try CLI.run(["bench", "--model", model, "--runs", "1", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(report["task"] as? String == "image-to-text")
        for key in ["image_ms", "first_token_ms", "decode_tokens_per_s"] {
            #expect((report[key] as? Double ?? 0) > 0, "\(key)")
        }
    }

    /// Without --dtype a checkpoint runs as it is stored (bf16 where the CPU multiplies bf16), as transformers 5 loads it.
    @Test func benchRunsACheckpointInThePrecisionItStores() throws {
        let bf16 = CLI.fixtures.appendingPathComponent("image-to-text/blip2-t5-bf16").path
        for (checkpoint, options, dtype) in [(model, [String](), "fp32"), (bf16, [], MatrixPrecision.bfloat16.available.rawValue),
                                              (bf16, ["--dtype", "fp32"], "fp32")] {
            let run = try CLI.run(["bench", "--model", checkpoint, "--runs", "1", "--json"] + options)
            #expect(run.status == 0, "\(run.stderr)")
            let report = try #require(try CLI.json(run) as? [String: Any])
            #expect(report["dtype"] as? String == dtype, "\(checkpoint) \(options)")
        }
    }

    @Test func badInputIsOneLine() throws {
        let clip = CLI.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax").path
        for (arguments, needle) in [
            (["ask", photo("chelsea.png"), "--model", clip, "--question", "why?"], "cannot run `vlm ask`"),
            (["caption", photo("chelsea.png"), "--model", clip], "cannot run `vlm caption`"),
            (["caption", CLI.fixtures.path, "--model", model], CLI.fixtures.path),
            (["chat", "--model", model], "--image"),
            (["caption", photo("chelsea.png"), "--model", model, "--prompt", String(repeating: "long ", count: 80)], "prompt"),
        ] {
            let run = try CLI.run(arguments)
            #expect(run.status != 0, "\(arguments)")
            #expect(run.stdout.isEmpty)
            #expect(run.stderr.split(separator: "\n").count == 1, "\(run.stderr)")
            #expect(run.stderr.contains(needle), "\(run.stderr)")
        }
    }

    /// ViLT classifies: `--top-k` answers with sigmoid scores, no ids (oracle/vilt.py).
    @Test func askWithViltGivesScoredAnswers() throws {
        struct Vilt: Decodable {
            struct Scored: Decodable { let answer: String; let score: Double }
            struct Answers: Decodable { let top: [Scored] }
            struct Question: Decodable { let question: String; let answers: [String: Answers] }
            let questions: [Question]
        }
        let model = CLI.fixtures.appendingPathComponent("vilt/b16-gelu").path
        let question = try JSONDecoder().decode(Vilt.self, from: Data(contentsOf: URL(fileURLWithPath: model).appendingPathComponent("expected.json"))).questions[0]
        let run = try CLI.run(["ask", photo("chelsea.png"), "--model", model, "--question", question.question, "--top-k", "3", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(output.first?["question"] as? String == question.question)
        let answers = try #require(output.first?["answers"] as? [[String: Any]])
        let reference = try #require(question.answers["chelsea.png"]).top.prefix(3)
        #expect(answers.map { Set($0.keys) } == Array(repeating: ["answer", "score"], count: 3))
        #expect(answers.map { $0["answer"] as? String } == reference.map(\.answer))
        #expect(zip(answers, reference).allSatisfy { abs(($0["score"] as? Double ?? -1) - $1.score) <= 1e-5 })

        let long = try CLI.run(["ask", photo("chelsea.png"), "--model", model, "--question",
                                Array(repeating: "cat", count: 50).joined(separator: " ")])
        #expect(long.status == 1)
        #expect(long.stderr.split(separator: "\n").count == 1, "\(long.stderr)")
        #expect(long.stderr.contains("40"))
    }
}
