import ArgumentParser
import Foundation
import SwiftVLM

struct Detect: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Zero-shot object detection (OWL-ViT, OWLv2): boxes in the image for free-text labels, or like an example image.",
        discussion: """
            Boxes whose score is above --threshold, best first, in the image's pixels, as transformers' \
            zero-shot-object-detection pipeline gives them. With --query-image, image-guided detection: boxes like \
            the object the example image shows, named by its file name (scores are transformers' display alphas: 1 \
            for the best box). With --out FILE.png, the image with every box and "label score" drawn on it; an \
            existing file is not overwritten without --force.
            """)

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(help: "Comma-separated labels, e.g. \"a cat,a remote control\".")
    var labels: String?

    @Option(help: "The lowest score reported (default: 0.1 for labels, 0 for --query-image).")
    var threshold: Float?

    @Option(name: .customLong("query-image"), help: "An example image of what to find (image-guided detection), instead of labels.")
    var queryImage: String?

    @Option(help: "A PNG file to draw the boxes on the image in.")
    var out: String?

    @Flag(help: "Overwrite --out if it exists.")
    var force = false

    @Flag(help: "Print JSON instead of a table.")
    var json = false

    @Argument(help: "The image (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var image: String

    private struct Result: Encodable {
        let label: String
        let score: Float
        let box: DetectionBox
    }

    func run() async throws {
        let labels = try labels.map(Segment.parseLabels) ?? []
        switch (labels.isEmpty, queryImage) {
        case (true, nil): throw PipelineError.noCandidateLabels
        case (false, .some): throw DetectError.labelsAndQueryImage
        default: break
        }
        if let out, !force, FileManager.default.fileExists(atPath: out) { throw DetectError.exists(out) }

        let photo = try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: image))
        let query = try queryImage.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let directory = try await options.directory()
        let pipeline = try precision.building { try ZeroShotObjectDetectionPipeline(directory: directory) }
        let found: [DetectedObject]
        if let query, let queryImage {
            let name = URL(fileURLWithPath: queryImage).deletingPathExtension().lastPathComponent
            found = try pipeline(photo, query: query, label: name, threshold: threshold ?? 0)
        } else {
            found = try pipeline(photo, labels: labels, threshold: threshold ?? 0.1)
        }

        if let out {
            try Self.picture(photo, found, labels: labels).writePNG(to: URL(fileURLWithPath: out))
        }
        if json {
            try printJSON(found.map { Result(label: $0.label, score: $0.score, box: $0.box) })
            return
        }
        print("score   label  box (xmin, ymin, xmax, ymax)")
        for object in found {
            let box = object.box
            print("\(formatted(object.score))  \(object.label)  (\(box.xmin), \(box.ymin), \(box.xmax), \(box.ymax))")
        }
        if found.isEmpty { print("(nothing above the threshold)") }
        if let out { print("picture: \(out)") }
    }

    /// The photo with each box outlined in its label's colour and "label score" beside it, best boxes' labels placed
    /// first.
    static func picture(_ photo: RGBImage, _ found: [DetectedObject], labels: [String]) -> RGBImage {
        var picture = photo
        let boxes = found.map { object in
            let box = object.box
            return LabeledBox(PixelRect(x: box.xmin, y: box.ymin, width: box.xmax - box.xmin, height: box.ymax - box.ymin),
                              label: "\(object.label) \(formatted(object.score, digits: 2))",
                              color: .label(labels.firstIndex(of: object.label) ?? 0))
        }
        picture.drawBoxes(boxes, style: DrawingStyle(width: photo.width, height: photo.height))
        return picture
    }
}

enum DetectError: Error, CustomStringConvertible {
    case labelsAndQueryImage
    case exists(String)

    var description: String {
        switch self {
        case .labelsAndQueryImage: "give --labels or --query-image, not both"
        case .exists(let path): "\(path) exists; pass --force to overwrite it"
        }
    }
}
