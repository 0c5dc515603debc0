/// Python `str` operations on Unicode scalars (code points), which is what Python strings are made of.
enum PythonStrings {
    static func strip(_ text: String, _ characters: String?, leading: Bool, trailing: Bool) -> String {
        let scalars = Array(text.unicodeScalars)
        let set = characters.map { Set($0.unicodeScalars) }
        func removable(_ scalar: Unicode.Scalar) -> Bool {
            set.map { $0.contains(scalar) } ?? isPythonWhitespace(scalar)
        }
        var start = 0
        var end = scalars.count
        if leading { while start < end, removable(scalars[start]) { start += 1 } }
        if trailing { while end > start, removable(scalars[end - 1]) { end -= 1 } }
        return String(String.UnicodeScalarView(scalars[start..<end]))
    }

    /// `str.split(sep, maxsplit)`; with no separator, runs of whitespace split and empty pieces are dropped.
    static func split(_ text: String, _ separator: String?, maxSplit: Int) -> [String] {
        let scalars = Array(text.unicodeScalars)
        var pieces: [String] = []
        guard let separator else {
            var index = 0
            var splits = 0
            while index < scalars.count {
                while index < scalars.count, isPythonWhitespace(scalars[index]) { index += 1 }
                guard index < scalars.count else { break }
                if maxSplit >= 0, splits == maxSplit {
                    var end = scalars.count
                    while end > index, isPythonWhitespace(scalars[end - 1]) { end -= 1 }
                    pieces.append(String(String.UnicodeScalarView(scalars[index..<end])))
                    break
                }
                let start = index
                while index < scalars.count, !isPythonWhitespace(scalars[index]) { index += 1 }
                pieces.append(String(String.UnicodeScalarView(scalars[start..<index])))
                splits += 1
            }
            return pieces
        }
        let needle = Array(separator.unicodeScalars)
        var start = 0
        var index = 0
        while index + needle.count <= scalars.count, maxSplit < 0 || pieces.count < maxSplit {
            if scalars[index..<index + needle.count].elementsEqual(needle) {
                pieces.append(String(String.UnicodeScalarView(scalars[start..<index])))
                index += needle.count
                start = index
            } else {
                index += 1
            }
        }
        pieces.append(String(String.UnicodeScalarView(scalars[start...])))
        return pieces
    }

    /// `str.rsplit(sep, maxsplit)`.
    static func rsplit(_ text: String, _ separator: String?, maxSplit: Int) -> [String] {
        guard maxSplit >= 0 else { return split(text, separator, maxSplit: -1) }
        let reversedText = String(String.UnicodeScalarView(text.unicodeScalars.reversed()))
        let reversedSeparator = separator.map { String(String.UnicodeScalarView($0.unicodeScalars.reversed())) }
        return split(reversedText, reversedSeparator, maxSplit: maxSplit).reversed().map {
            String(String.UnicodeScalarView($0.unicodeScalars.reversed()))
        }
    }

    static func isLineBreak(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029: true
        default: false
        }
    }

    /// `str.splitlines()`.
    static func splitlines(_ text: String, keepEnds: Bool = false) -> [String] {
        let scalars = Array(text.unicodeScalars)
        var lines: [String] = []
        var start = 0
        var index = 0
        while index < scalars.count {
            guard isLineBreak(scalars[index]) else {
                index += 1
                continue
            }
            var end = index + 1
            if scalars[index] == "\r", end < scalars.count, scalars[end] == "\n" { end += 1 }
            lines.append(String(String.UnicodeScalarView(scalars[start..<(keepEnds ? end : index)])))
            start = end
            index = end
        }
        if start < scalars.count { lines.append(String(String.UnicodeScalarView(scalars[start...]))) }
        return lines
    }

    static func upper(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        for scalar in text.unicodeScalars { result.append(contentsOf: scalar.properties.uppercaseMapping.unicodeScalars) }
        return String(result)
    }

    static func lower(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        for scalar in text.unicodeScalars { result.append(contentsOf: scalar.properties.lowercaseMapping.unicodeScalars) }
        return String(result)
    }

    /// `str.capitalize()`: the first character in title case, the rest in lower case.
    static func capitalize(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        for (index, scalar) in text.unicodeScalars.enumerated() {
            let mapping = index == 0 ? scalar.properties.titlecaseMapping : scalar.properties.lowercaseMapping
            result.append(contentsOf: mapping.unicodeScalars)
        }
        return String(result)
    }

    /// `str.title()`: a character after a cased one goes to lower case, any other to title case.
    static func title(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        var previousIsCased = false
        for scalar in text.unicodeScalars {
            let mapping = previousIsCased ? scalar.properties.lowercaseMapping : scalar.properties.titlecaseMapping
            result.append(contentsOf: mapping.unicodeScalars)
            previousIsCased = scalar.properties.isCased
        }
        return String(result)
    }

    /// jinja2's `title` filter: words start after `-`, whitespace or an opening bracket.
    static func jinjaTitle(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        var atWordStart = true
        for scalar in text.unicodeScalars {
            let isSeparator = isPythonWhitespace(scalar) || "-({[<".unicodeScalars.contains(scalar)
            if isSeparator {
                result.append(scalar)
                atWordStart = true
            } else {
                let mapping = atWordStart ? scalar.properties.uppercaseMapping : scalar.properties.lowercaseMapping
                result.append(contentsOf: mapping.unicodeScalars)
                atWordStart = false
            }
        }
        return String(result)
    }

    static func replace(_ text: String, _ old: String, _ new: String, count: Int) -> String {
        let scalars = Array(text.unicodeScalars)
        let needle = Array(old.unicodeScalars)
        var result = String.UnicodeScalarView()
        var replaced = 0
        if needle.isEmpty {
            // Python inserts `new` before every character and at the end.
            for scalar in scalars {
                if count < 0 || replaced < count {
                    result.append(contentsOf: new.unicodeScalars)
                    replaced += 1
                }
                result.append(scalar)
            }
            if count < 0 || replaced < count { result.append(contentsOf: new.unicodeScalars) }
            return String(result)
        }
        var index = 0
        while index < scalars.count {
            if count < 0 || replaced < count, index + needle.count <= scalars.count,
                scalars[index..<index + needle.count].elementsEqual(needle)
            {
                result.append(contentsOf: new.unicodeScalars)
                index += needle.count
                replaced += 1
            } else {
                result.append(scalars[index])
                index += 1
            }
        }
        return String(result)
    }

    /// `str.find` / `str.rfind` in code points, or -1.
    static func find(_ text: String, _ needle: String, reverse: Bool) -> Int {
        let scalars = Array(text.unicodeScalars)
        let pattern = Array(needle.unicodeScalars)
        guard pattern.count <= scalars.count else { return -1 }
        let positions = Array(0...(scalars.count - pattern.count))
        for index in reverse ? positions.reversed() : positions
        where scalars[index..<index + pattern.count].elementsEqual(pattern) {
            return index
        }
        return -1
    }

    static func count(_ text: String, _ needle: String) -> Int {
        let pattern = Array(needle.unicodeScalars)
        let scalars = Array(text.unicodeScalars)
        if pattern.isEmpty { return scalars.count + 1 }
        var count = 0
        var index = 0
        while index + pattern.count <= scalars.count {
            if scalars[index..<index + pattern.count].elementsEqual(pattern) {
                count += 1
                index += pattern.count
            } else {
                index += 1
            }
        }
        return count
    }

    static func hasPrefix(_ text: String, _ prefix: String) -> Bool {
        text.unicodeScalars.starts(with: prefix.unicodeScalars)
    }

    static func hasSuffix(_ text: String, _ suffix: String) -> Bool {
        text.unicodeScalars.reversed().starts(with: suffix.unicodeScalars.reversed())
    }

    /// jinja2's `escape`: HTML special characters as entities.
    static func htmlEscape(_ text: String) -> String {
        var result = ""
        for character in text.unicodeScalars {
            switch character {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "\"": result += "&#34;"
            case "'": result += "&#39;"
            default: result.unicodeScalars.append(character)
            }
        }
        return result
    }
}
