import ArgumentParser
import Foundation
import SwiftVLM

struct Segment: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Zero-shot segmentation (CLIPSeg, GroupViT): where in the image each label is, as a probability per pixel.",
        discussion: """
            CLIPSeg scores each label on its own (sigmoid); GroupViT's labels compete for each pixel (softmax over \
            the labels: give each pixel its most likely label), over the centre crop its processor shows the model, \
            and it takes no --prompt-image. Labels are used as given (GroupViT's docs write "a photo of a cat"). \
            With --out DIR, for each label DIR/<label>.npy (the model's logits, float32) and DIR/<label>.png (the \
            probability map resized to the image, grey levels), and DIR/overlay.png (the image with every label's \
            region tinted in its colour, and a legend). Existing files are not overwritten without --force.
            """)

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(help: "Comma-separated labels, e.g. \"a cat,the sky\".")
    var labels: String?

    @Option(name: .customLong("prompt-image"),
            help: "An example image of something to find (one-shot), named in the output by its file name; may be repeated.")
    var promptImages: [String] = []

    @Option(help: "Directory for the .npy logits, .png masks and overlay.png (created if missing).")
    var out: String?

    @Flag(help: "Overwrite output files that exist.")
    var force = false

    @Flag(help: "Print JSON instead of a table.")
    var json = false

    @Argument(help: "The image (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var image: String

    private struct LabelResult: Encodable {
        let label: String
        let logits: String?
        let mask: String?
        let coverage: Double
    }

    func run() async throws {
        let texts = try labels.map(Self.parseLabels) ?? []
        let exampleNames = promptImages.map { URL(fileURLWithPath: $0).deletingPathExtension().lastPathComponent }
        let names = texts + exampleNames
        guard !names.isEmpty else { throw PipelineError.noCandidateLabels }
        if let repeated = names.enumerated().first(where: { names[..<$0.offset].contains($0.element) })?.element {
            throw SegmentError.repeatedLabel(repeated)
        }
        let files = try out.map { try OutputFiles(directory: $0, labels: names, force: force) }

        let photo = try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: image))
        let examples = try promptImages.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let directory = try await options.directory()
        let pipeline = try precision.building { try ZeroShotImageSegmentationPipeline(directory: directory) }
        let prompts = texts.map { SegmentationPrompt.text($0) }
            + zip(examples, exampleNames).map { SegmentationPrompt.image($0, label: $1) }
        let masks = try pipeline(photo, prompts: prompts)

        if let files {
            try files.write(masks, photo: photo)
        }
        let results = masks.enumerated().map { index, mask in
            LabelResult(label: mask.label, logits: files?.logits[index], mask: files?.masks[index], coverage: mask.coverage)
        }
        if json {
            try printJSON(results)
            return
        }
        print("coverage  label")
        for result in results {
            print("  \(formatted(Float(result.coverage)))  \(result.label)\(result.mask.map { "  (\($0))" } ?? "")")
        }
        if let files { print("overlay: \(files.overlay)") }
    }

    /// The labels of a comma-separated list, trimmed; an empty one is an error.
    static func parseLabels(_ list: String) throws -> [String] {
        let labels = list.split(separator: ",", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        if let empty = labels.firstIndex(where: \.isEmpty), labels.count > 1 || !list.isEmpty {
            throw PipelineError.emptyLabel(position: empty + 1)
        }
        return labels.filter { !$0.isEmpty }
    }
}

/// The files `vlm segment --out DIR` writes: per label `<name>.npy` and `<name>.png`, and `overlay.png`, where a
/// label's name is the label with characters file names cannot hold replaced, made unique.
struct OutputFiles {
    let directory: URL
    let logits: [String]
    let masks: [String]
    let overlay: String

    /// Paths as the user wrote the directory; refuses (without `force`) when any of them exists already, before
    /// anything is computed.
    init(directory: String, labels: [String], force: Bool) throws {
        self.directory = URL(fileURLWithPath: directory)
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), !isDirectory.boolValue {
            throw SegmentError.notADirectory(directory)
        }
        let prefix = directory.hasSuffix("/") ? directory : directory + "/"
        var taken: Set<String> = ["overlay"]
        let names = labels.map { label in
            let base = Self.fileName(label)
            var name = base, count = 2
            while taken.contains(name.lowercased()) {
                name = "\(base)-\(count)"
                count += 1
            }
            taken.insert(name.lowercased())
            return name
        }
        logits = names.map { prefix + $0 + ".npy" }
        masks = names.map { prefix + $0 + ".png" }
        overlay = prefix + "overlay.png"
        if !force, let existing = (logits + masks + [overlay]).first(where: { FileManager.default.fileExists(atPath: $0) }) {
            throw SegmentError.exists(existing)
        }
    }

    /// `label` as a file name: letters, digits, spaces and `-_.,()+` kept, anything else (path separators, control
    /// characters) as "_", no leading dot, at most 100 characters.
    static func fileName(_ label: String) -> String {
        let kept = String(label.prefix(100).map { character -> Character in
            character.isLetter || character.isNumber || " -_.,()+".contains(character) ? character : "_"
        })
        return kept.hasPrefix(".") ? "_" + kept.dropFirst() : kept
    }

    func write(_ masks: [SegmentationMask], photo: RGBImage) throws {
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw SegmentError.unwritable(directory.path, (error as NSError).localizedFailureReason ?? error.localizedDescription)
        }
        for (index, mask) in masks.enumerated() {
            do {
                try Data(mask.logits.npyBytes).write(to: URL(fileURLWithPath: logits[index]), options: .atomic)
            } catch {
                throw SegmentError.unwritable(logits[index], (error as NSError).localizedFailureReason ?? error.localizedDescription)
            }
            try PNGEncoding.write(mask.grayscale, width: photo.width, height: photo.height, color: .gray,
                                  to: URL(fileURLWithPath: self.masks[index]))
        }
        let regions = masks.map { (label: $0.label, probabilities: $0.probabilities.scalars) }
        try photo.segmentationOverlay(regions).writePNG(to: URL(fileURLWithPath: overlay))
    }
}

enum SegmentError: Error, CustomStringConvertible {
    case repeatedLabel(String)
    case exists(String)
    case notADirectory(String)
    case unwritable(String, String)

    var description: String {
        switch self {
        case .repeatedLabel(let label): "label \"\(label)\" is given twice; each label needs its own output"
        case .exists(let path): "\(path) exists; pass --force to overwrite it"
        case .notADirectory(let path): "\(path): --out must be a directory, and this is a file"
        case .unwritable(let path, let reason): "\(path): cannot write: \(reason)"
        }
    }
}
