// Integrity of torch.save's files: they are zip archives whose central directory holds a
// CRC-32 of every entry, which LibTorch's reader does not check (a checkpoint with a
// damaged block loaded as NaN weights). Checked here before such a file is parsed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace minimind {

// Checks every stored entry of a zip archive against its CRC-32 and its bounds. Returns ""
// when all hold, else what is wrong ("entry 'x/data/3': CRC-32 mismatch", "not a zip
// archive: no end-of-central-directory record"). Compressed entries (torch.save stores
// its entries uncompressed) are checked for bounds only.
std::string zip_damage(std::string_view archive);

// zlib's CRC-32 of any number of bytes (state.json carries one of its own text).
uint32_t crc32_of(std::string_view bytes);

}  // namespace minimind
