import CLCMS2

/// Pillow's `convert("RGB")` of a "LAB" image. Pillow hands it to LittleCMS: a transform from LittleCMS's built-in
/// Lab v2 profile (D50 white) to its sRGB profile, perceptual intent, no flags (`ImageCms.buildTransform`'s
/// defaults), over its four-byte pixels whose a* and b* are offset by 128. The same transform here, over three-byte
/// pixels, gives Pillow's bytes: Debian's LittleCMS 2.14 and the 2.19 in Pillow's wheel agree on every one of the
/// 2^24 8-bit Lab triples (also with the flag and the pixel layout used here).
enum CIELab {
    /// Made once and shared: without its one-pixel cache (cmsFLAGS_NOCACHE, which changes no result) a transform
    /// holds no state that applying it changes, so threads may apply it at once.
    nonisolated(unsafe) private static let transform: cmsHTRANSFORM? = {
        // lcms2.h's pixel-type macros, which Swift does not import: colour space, three one-byte channels.
        func pixelType(_ space: Int32) -> UInt32 { UInt32(space) << 16 | 3 << 3 | 1 }
        guard let lab = cmsCreateLab2Profile(nil), let srgb = cmsCreate_sRGBProfile() else { return nil }
        defer {
            cmsCloseProfile(lab)
            cmsCloseProfile(srgb)
        }
        return cmsCreateTransform(lab, pixelType(PT_LabV2), srgb, pixelType(PT_RGB), UInt32(INTENT_PERCEPTUAL),
                                  UInt32(cmsFLAGS_NOCACHE))
    }()

    /// RGB bytes of `lab`'s Lab triples (L*, a* + 128, b* + 128 a pixel, as Pillow's LAB mode holds them).
    static func rgb(fromLab lab: [UInt8]) -> [UInt8]? {
        guard let transform else { return nil }
        var rgb = [UInt8](repeating: 0, count: lab.count)
        lab.withUnsafeBytes { source in
            rgb.withUnsafeMutableBytes { cmsDoTransform(transform, source.baseAddress, $0.baseAddress, UInt32(lab.count / 3)) }
        }
        return rgb
    }
}
