/// Rows of an embedding table: `[ids.count, dim]`.
public func embedding(_ table: Tensor, ids: [Int]) -> Tensor {
    precondition(table.rank == 2, "embedding table must be [vocab, dim], got \(table.shape)")
    let (vocabulary, dim) = (table.shape[0], table.shape[1])
    let output = Tensor(uninitialized: [ids.count, dim])
    for (row, id) in ids.enumerated() {
        precondition(id >= 0 && id < vocabulary, "embedding id \(id) outside vocabulary of \(vocabulary)")
        (output.storage.pointer + row * dim).initialize(from: table.storage.pointer + id * dim, count: dim)
    }
    return output
}

/// Columns of an embedding table, one per id: `[dim, ids.count]`, the transpose of ``embedding(_:ids:)``'s rows.
/// A table of per-head values looked up by position (T5's relative position buckets) becomes per-head rows.
public func embeddingColumns(_ table: Tensor, ids: [Int]) -> Tensor {
    precondition(table.rank == 2, "embedding table must be [vocab, dim], got \(table.shape)")
    let (vocabulary, dim) = (table.shape[0], table.shape[1])
    let output = Tensor(uninitialized: [dim, ids.count])
    for (column, id) in ids.enumerated() {
        precondition(id >= 0 && id < vocabulary, "embedding id \(id) outside vocabulary of \(vocabulary)")
        for feature in 0..<dim {
            output.storage.pointer[feature * ids.count + column] = table.storage.pointer[id * dim + feature]
        }
    }
    return output
}

/// Joins tensors along `axis` (negative counts from the end); all other dimensions must agree.
public func concatenate(_ tensors: [Tensor], axis: Int) -> Tensor {
    precondition(!tensors.isEmpty, "concatenate of no tensors")
    let first = tensors[0].shape
    let axis = axis < 0 ? axis + first.count : axis
    precondition(axis >= 0 && axis < first.count, "concatenate axis \(axis) out of range for \(first)")
    for tensor in tensors {
        precondition(tensor.rank == first.count && tensor.shape.enumerated().allSatisfy { $0.offset == axis || $0.element == first[$0.offset] },
                     "concatenate along \(axis): \(tensor.shape) does not match \(first)")
    }
    var shape = first
    shape[axis] = tensors.reduce(0) { $0 + $1.shape[axis] }
    let output = Tensor(uninitialized: shape)
    let outer = first[..<axis].reduce(1, *)
    let outputBlock = shape[axis...].reduce(1, *)
    var offset = 0
    for tensor in tensors {
        let block = tensor.shape[axis...].reduce(1, *)
        for index in 0..<outer {
            (output.storage.pointer + index * outputBlock + offset).initialize(from: tensor.storage.pointer + index * block, count: block)
        }
        offset += block
    }
    return output
}

/// Positions `range` of `x [B, T, ...]` (or of a mask `[B, T]`), copied: `x[:, range]`.
public func sequenceSlice(_ x: Tensor, _ range: Range<Int>) -> Tensor {
    precondition(x.rank >= 2 && range.lowerBound >= 0 && range.upperBound <= x.shape[1],
                 "sequenceSlice: positions \(range) of \(x.shape)")
    let (batch, length) = (x.shape[0], x.shape[1])
    let inner = x.shape.dropFirst(2).reduce(1, *)
    let output = Tensor(uninitialized: [batch, range.count] + x.shape.dropFirst(2))
    for item in 0..<batch {
        (output.storage.pointer + item * range.count * inner)
            .initialize(from: x.storage.pointer + (item * length + range.lowerBound) * inner, count: range.count * inner)
    }
    return output
}

/// `x[b, positions[b], :]` for each `b` of `x [B, T, D]`: `[B, D]`.
public func gatherTokens(_ x: Tensor, positions: [Int]) -> Tensor {
    precondition(x.rank == 3 && positions.count == x.shape[0], "gatherTokens needs [B, T, D] and B positions, got \(x.shape) and \(positions.count)")
    let (length, dim) = (x.shape[1], x.shape[2])
    let output = Tensor(uninitialized: [positions.count, dim])
    for (item, position) in positions.enumerated() {
        precondition(position >= 0 && position < length, "gatherTokens position \(position) outside sequence of \(length)")
        (output.storage.pointer + item * dim).initialize(from: x.storage.pointer + (item * length + position) * dim, count: dim)
    }
    return output
}

/// `x` with rows `rows[i]` replaced by row `i` of `source`, where `x [..., D]` is read as rows of its last dimension
/// and `source` holds `rows.count` rows of `D` values (torch's `x.masked_scatter(mask[..., None], source)` with the
/// mask true at exactly those rows, in increasing order). A VLM puts image features where its image tokens are.
public func replacingRows(of x: Tensor, at rows: [Int], with source: Tensor) -> Tensor {
    let width = x.shape.last ?? 0
    precondition(x.rank >= 1 && source.count == rows.count * width,
                 "replacingRows: \(rows.count) rows of \(width) values from \(source.shape) into \(x.shape)")
    let rowCount = width == 0 ? 0 : x.count / width
    let output = Tensor(uninitialized: x.shape)
    output.storage.pointer.initialize(from: x.storage.pointer, count: x.count)
    for (index, row) in rows.enumerated() {
        precondition(row >= 0 && row < rowCount, "replacingRows: row \(row) outside \(rowCount) rows")
        (output.storage.pointer + row * width).update(from: source.storage.pointer + index * width, count: width)
    }
    return output
}

/// `x [N, ..., C]` with its last axis moved to the second, `[N, C, ...]` (`x.movedim(-1, 1)`, copied): a ViT's
/// tokens `[B, H·W, C]` as the channels of an image, `[B, C, H·W]`, for convolutions to read.
public func channelsFirst(_ x: Tensor) -> Tensor {
    precondition(x.rank >= 2, "channelsFirst needs [N, ..., C], got \(x.shape)")
    let (batch, channels) = (x.shape[0], x.shape[x.rank - 1])
    let positions = x.shape.dropFirst().dropLast().reduce(1, *)
    let output = Tensor(uninitialized: [batch, channels] + x.shape.dropFirst().dropLast())
    for item in 0..<batch {
        let source = x.storage.pointer + item * positions * channels
        let destination = output.storage.pointer + item * channels * positions
        for position in 0..<positions {
            for channel in 0..<channels { destination[channel * positions + position] = source[position * channels + channel] }
        }
    }
    return output
}
