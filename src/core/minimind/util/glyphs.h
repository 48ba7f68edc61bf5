// The eight block glyphs of the terminal's histograms and sparklines.
#pragma once

#include <algorithm>

namespace minimind {

// "▁" for level 0 up to "█" for level 7; levels outside are clamped.
inline const char* bar_glyph(long level) {
  static const char* const kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  return kBars[std::clamp(level, 0L, 7L)];
}

}  // namespace minimind
