// TextStream: the text printed token by token equals decoding all ids at once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "minimind/data/jsonl.h"
#include "minimind/data/tokenizer.h"
#include "minimind/eval/text_stream.h"
#include "support/test_support.h"

namespace minimind {
namespace {

Tokenizer austen_tokenizer() {
  const std::string dir = test::temp_dir("text_stream");
  std::vector<std::string> texts;
  read_corpus(test::small_corpus(dir, 200), {},
              [&](std::string_view t, int64_t) { texts.emplace_back(t); });
  std::vector<std::string_view> views(texts.begin(), texts.end());
  return Tokenizer::from_bytes(Tokenizer::train(views, 600), "austen");
}

TEST(TextStream, StreamedTextEqualsDecodingAllIds) {
  const Tokenizer tok = austen_tokenizer();
  // English the vocabulary knows, and characters it has never seen: CJK and emoji come as
  // byte-fallback pieces, 3 or 4 per character.
  for (const std::string text :
       {"Emma Woodhouse, handsome, clever, and rich.", "  two leading spaces\nand a newline",
        "中文 and 🙂 mixed with ünïcödé", "🙂🚀"}) {
    SCOPED_TRACE(text);
    const std::vector<int32_t> ids = tok.encode(text);
    TextStream stream(tok);
    std::string streamed;
    int byte_pieces = 0, waits = 0;
    for (int32_t id : ids) {
      const std::string part = stream.add(id);
      if (tok.piece_type(id) == PieceType::byte) ++byte_pieces;
      if (part.empty()) ++waits;
      // Every part is whole UTF-8: no replacement character is ever printed.
      EXPECT_EQ(part.find("\xEF\xBF\xBD"), std::string::npos);
      streamed += part;
    }
    streamed += stream.finish();
    EXPECT_EQ(streamed, tok.decode(ids));
    EXPECT_EQ(stream.ids(), ids);
    if (text.find("🙂") != std::string::npos) {
      EXPECT_GE(byte_pieces, 4) << "the emoji should be byte pieces";
      EXPECT_GE(waits, 3) << "a character split over byte pieces prints at its last byte";
    }
  }
}

// A generation cut inside a character: the unfinished bytes come out in finish(), as
// decoding all ids gives them.
TEST(TextStream, UnfinishedCharacterComesOutAtTheEnd) {
  const Tokenizer tok = austen_tokenizer();
  std::vector<int32_t> ids = tok.encode("ok 🙂");
  ids.pop_back();  // the emoji's last byte piece
  ASSERT_EQ(tok.piece_type(ids.back()), PieceType::byte);
  TextStream stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.add(id);
  EXPECT_EQ(streamed + stream.finish(), tok.decode(ids));
}

}  // namespace
}  // namespace minimind
