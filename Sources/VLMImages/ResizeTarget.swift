import Foundation
import VLMTensor

/// The target size of the resize step, in the forms transformers' `SizeDict` takes.
public enum ResizeTarget: Sendable, Equatable {
    /// `{"height", "width"}`: exactly this size.
    case exact(height: Int, width: Int)
    /// `{"shortest_edge"}` (and an int `size` in CLIP's configs): the short side becomes this, the long side keeps
    /// the aspect ratio, truncated.
    case shortestEdge(Int)
    /// `{"shortest_edge", "longest_edge"}`: as `shortestEdge`, but scaled down so the long side stays within bound.
    case shortestEdgeBounded(shortest: Int, longest: Int)
    /// `{"max_height", "max_width"}`: the largest aspect-preserving size within both.
    case maxHeightWidth(maxHeight: Int, maxWidth: Int)

    /// The (height, width) transformers' PIL backend resizes an image of this size to.
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        switch self {
        case .exact(let h, let w):
            return (h, w)
        case .shortestEdge(let size):
            // get_resize_output_image_size(default_to_square=False): int(size * long / short).
            let (short, long) = width <= height ? (width, height) : (height, width)
            let newLong = Int(Double(size * long) / Double(short))
            return width <= height ? (newLong, size) : (size, newLong)
        case .shortestEdgeBounded(var size, let maxSize):
            // get_size_with_aspect_ratio, with Python's round-half-even.
            let minOriginal = Double(min(height, width)), maxOriginal = Double(max(height, width))
            var rawSize: Double?
            if maxOriginal / minOriginal * Double(size) > Double(maxSize) {
                let raw = Double(maxSize) * minOriginal / maxOriginal
                rawSize = raw
                size = Int(raw.rounded(.toNearestOrEven))
            }
            if (height <= width && height == size) || (width <= height && width == size) {
                return (height, width)
            }
            if width < height {
                let long = rawSize.map { Int($0 * Double(height) / Double(width)) } ?? Int(Double(size * height) / Double(width))
                return (long, size)
            }
            let long = rawSize.map { Int($0 * Double(width) / Double(height)) } ?? Int(Double(size * width) / Double(height))
            return (size, long)
        case .maxHeightWidth(let maxHeight, let maxWidth):
            let scale = min(Double(maxHeight) / Double(height), Double(maxWidth) / Double(width))
            return (Int(Double(height) * scale), Int(Double(width) * scale))
        }
    }
}

