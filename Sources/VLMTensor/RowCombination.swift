/// A linear map from the rows of a table `[inputRows, D]` to new rows `[outputRows, D]`, each a weighted sum of
/// table rows: a gather (every weight 1), a bilinear resize of a grid of rows, or both composed. Models that lay
/// image features out in their own order (LLaVA-NeXT's tile grids) say so with one; training hands gradients back
/// through its transpose.
public struct RowCombination: Sendable, Equatable {
    /// Rows of the table it reads.
    public let inputRows: Int
    /// Where each output row's sources start in `sources` and `weights`, and where the last one ends.
    private var offsets: [Int] = [0]
    private var sources: [Int] = []
    private var weights: [Float] = []

    public var outputRows: Int { offsets.count - 1 }

    /// Table rows `rows`, in order (``embedding(_:ids:)``).
    public init(inputRows: Int, gathering rows: [Int]) {
        self.inputRows = inputRows
        offsets = Array(0...rows.count)
        sources = rows
        weights = Array(repeating: 1, count: rows.count)
        precondition(rows.allSatisfy { (0..<inputRows).contains($0) }, "a gather beyond a table of \(inputRows) rows")
    }

    /// Each output row the sum of its `(row, weight)` pairs' weighted table rows, in the order given; pairs of
    /// weight 0 are left out.
    public init(inputRows: Int, rows: [[(row: Int, weight: Float)]]) {
        self.inputRows = inputRows
        for terms in rows {
            for term in terms where term.weight != 0 {
                precondition((0..<inputRows).contains(term.row), "a row \(term.row) beyond a table of \(inputRows) rows")
                sources.append(term.row)
                weights.append(term.weight)
            }
            offsets.append(sources.count)
        }
    }

    /// Output row `row`'s sources and their weights.
    public func terms(ofRow row: Int) -> [(row: Int, weight: Float)] {
        (offsets[row]..<offsets[row + 1]).map { (sources[$0], weights[$0]) }
    }

    /// `torch.nn.functional.interpolate(…, size=(toHeight, toWidth), mode="bilinear", align_corners=False)` of a
    /// `height`×`width` grid of rows (row-major: table row `y · width + x` is the grid's `(y, x)`), read as the
    /// channels of an image, as ``interpolate(_:height:width:mode:)`` computes it: each output cell the sum of its
    /// (up to) four neighbours, weighted by the product of the two axes' weights.
    public static func bilinearResize(height: Int, width: Int, toHeight: Int, toWidth: Int) -> RowCombination {
        let rows = InterpolationTaps(input: height, output: toHeight, mode: .bilinear)
        let columns = InterpolationTaps(input: width, output: toWidth, mode: .bilinear)
        var cells: [[(row: Int, weight: Float)]] = []
        cells.reserveCapacity(toHeight * toWidth)
        for y in 0..<toHeight {
            for x in 0..<toWidth {
                cells.append((0..<2).flatMap { a in
                    (0..<2).map { b in
                        (rows.indices[y * 2 + a] * width + columns.indices[x * 2 + b], rows.weights[y * 2 + a] * columns.weights[x * 2 + b])
                    }
                })
            }
        }
        return RowCombination(inputRows: height * width, rows: cells)
    }

    /// The output rows of `table [inputRows, D]`: `[outputRows, D]`. A row with one source of weight 1 is a copy.
    public func callAsFunction(_ table: Tensor) -> Tensor {
        precondition(table.rank == 2 && table.shape[0] == inputRows, "a row combination of \(inputRows) rows applied to \(table.shape)")
        let output = Tensor(zeros: [outputRows, table.shape[1]])
        accumulate(table, into: output, transposed: false)
        return output
    }

    /// The table's gradient `[inputRows, D]` from the output rows' `[outputRows, D]`: each output row's gradient
    /// handed back to its sources by their weights (the transpose).
    public func backward(_ outputGradient: Tensor) -> Tensor {
        precondition(outputGradient.rank == 2 && outputGradient.shape[0] == outputRows, "a row combination's backward of \(outputRows) rows given \(outputGradient.shape)")
        let input = Tensor(zeros: [inputRows, outputGradient.shape[1]])
        accumulate(outputGradient, into: input, transposed: true)
        return input
    }

    /// Adds each term's weighted row of `source` to its row of `destination`: a table row to its output row, or
    /// (`transposed`) an output row to its table row.
    private func accumulate(_ source: Tensor, into destination: Tensor, transposed: Bool) {
        let width = source.shape[1]
        for row in 0..<outputRows {
            for term in offsets[row]..<offsets[row + 1] {
                let (read, write) = transposed ? (row, sources[term]) : (sources[term], row)
                let input = source.storage.pointer + read * width, output = destination.storage.pointer + write * width
                let weight = weights[term]
                for i in 0..<width { output[i] += weight * input[i] }
            }
        }
    }

    /// `parts`' output rows one after the other, each part reading table rows through `placement` (its own row →
    /// the shared table's) from a table of `inputRows`.
    public static func stacking(_ parts: [RowCombination], inputRows: Int,
                                placement: (_ part: Int, _ row: Int) -> Int) -> RowCombination {
        var stacked = RowCombination(inputRows: inputRows, rows: [])
        for (index, part) in parts.enumerated() {
            for term in 0..<part.sources.count {
                let row = placement(index, part.sources[term])
                precondition((0..<inputRows).contains(row), "a row \(row) beyond a table of \(inputRows) rows")
                stacked.sources.append(row)
                stacked.weights.append(part.weights[term])
            }
            let base = stacked.offsets.last!
            stacked.offsets += part.offsets.dropFirst().map { base + $0 }
        }
        return stacked
    }
}
