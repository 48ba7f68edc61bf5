#include "minimind/util/zip_check.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace minimind {
namespace {

// Little-endian fields of the zip format (APPNOTE.TXT, sections 4.3.7 to 4.3.16).
uint64_t le(std::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50,
                   kEndOfCentral = 0x06054b50, kZip64Locator = 0x07064b50, kZip64End = 0x06064b50;

}  // namespace

// In pieces: a range may be longer than zlib's uInt.
uint32_t crc32_of(std::string_view data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < data.size();) {
    const size_t n = std::min<size_t>(data.size() - at, size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data() + at), static_cast<uInt>(n));
    at += n;
  }
  return static_cast<uint32_t>(crc);
}

std::string zip_damage(std::string_view z) {
  // The end-of-central-directory record: 22 bytes and a comment of up to 65,535.
  if (z.size() < 22) return "not a zip archive: " + std::to_string(z.size()) + " bytes";
  size_t eocd = std::string_view::npos;
  const size_t lowest = z.size() >= 22 + 65535 ? z.size() - 22 - 65535 : 0;
  for (size_t at = z.size() - 22 + 1; at-- > lowest;)
    if (le(z, at, 4) == kEndOfCentral) {
      eocd = at;
      break;
    }
  if (eocd == std::string_view::npos)
    return "not a zip archive: no end-of-central-directory record (truncated?)";
  uint64_t entries = le(z, eocd + 10, 2), cd_size = le(z, eocd + 12, 4),
           cd_offset = le(z, eocd + 16, 4);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {  // zip64
    if (eocd < 20 || le(z, eocd - 20, 4) != kZip64Locator)
      return "damaged zip archive: no zip64 locator";
    const uint64_t end64 = le(z, eocd - 20 + 8, 8);
    if (z.size() < 56 || end64 > z.size() - 56 || le(z, end64, 4) != kZip64End)
      return "damaged zip archive: no zip64 end record";
    entries = le(z, end64 + 32, 8), cd_size = le(z, end64 + 40, 8),
    cd_offset = le(z, end64 + 48, 8);
  }
  if (cd_offset > z.size() || cd_size > z.size() - cd_offset)
    return "damaged zip archive: the central directory lies outside the file";
  size_t at = cd_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > cd_offset + cd_size || le(z, at, 4) != kCentralHeader)
      return "damaged zip archive: central directory entry " + std::to_string(i) + " is broken";
    const uint64_t method = le(z, at + 10, 2), crc = le(z, at + 16, 4);
    uint64_t packed = le(z, at + 20, 4), size = le(z, at + 24, 4), local = le(z, at + 42, 4);
    const size_t name_len = le(z, at + 28, 2), extra_len = le(z, at + 30, 2),
                 comment_len = le(z, at + 32, 2);
    if (at + 46 + name_len + extra_len + comment_len > cd_offset + cd_size)
      return "damaged zip archive: central directory entry " + std::to_string(i) + " is broken";
    const std::string name(z.substr(at + 46, name_len));
    // Sizes and offset too large for 32 bits are in the zip64 extra field, in this order.
    for (size_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = le(z, e, 2), len = le(z, e + 2, 2);
      if (id == 0x0001) {
        size_t f = e + 4;
        const size_t end = std::min<size_t>(f + len, at + 46 + name_len + extra_len);
        for (uint64_t* v : {&size, &packed, &local})
          if (*v == 0xFFFFFFFF && f + 8 <= end) *v = le(z, f, 8), f += 8;
      }
      e += 4 + len;
    }
    if (z.size() < 30 || local > z.size() - 30 || le(z, local, 4) != kLocalHeader)
      return "entry '" + name + "': its local header is damaged";
    const uint64_t data = local + 30 + le(z, local + 26, 2) + le(z, local + 28, 2);
    if (data > z.size() || packed > z.size() - data)
      return "entry '" + name + "' runs past the end of the file (truncated?)";
    if (method == 0 && (packed != size || crc32_of(z.substr(data, packed)) != crc))
      return "entry '" + name + "': CRC-32 mismatch (the bytes on disk changed)";
    at += 46 + name_len + extra_len + comment_len;
  }
  return "";
}

}  // namespace minimind
