// Texts generated from the schema: every key documented, and the README's reference current.
#include "launcher/config/config_schema.h"
#include "launcher/config/config_text.h"

#include <gmock/gmock.h>

#include <fstream>

namespace ht::test {
namespace {

TEST(ConfigText, EveryKeyHasADocAndAppearsInTheReference) {
  const std::string reference = config_reference_text();
  for (const FieldSpec& f : config_schema()) {
    EXPECT_FALSE(f.doc.empty()) << f.path();
    EXPECT_THAT(reference, ::testing::HasSubstr("    " + f.key + " (")) << f.path();
  }
}

TEST(ConfigText, ReadmeReferenceIsTheGeneratedOne) {
  std::ifstream in(std::string(HT_SOURCE_DIR) + "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- config-reference:begin -->\n", end = "<!-- config-reference:end -->";
  const size_t b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "README.md lacks the config reference markers";
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(readme.substr(b + begin.size(), e - b - begin.size()), config_reference_markdown())
      << "regenerate it: ./build/launcher/hybrid_train --config-reference-markdown";
}

}  // namespace
}  // namespace ht::test
