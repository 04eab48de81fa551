// Texts generated from the schema: every key documented, and docs/config-reference.md current.
#include "launcher/config/config_schema.h"
#include "launcher/config/config_text.h"

#include <gmock/gmock.h>

#include <algorithm>
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

// The start-up screen shows what a run changed, a line per section, not the ~100 keys of the
// resolved file.
TEST(ConfigText, TheStartUpScreenShowsWhatDiffersFromTheDefaults) {
  Config c;
  c.model.name = ModelKind::kGpt;
  c.training.steps = 300;
  c.memory.policy = MemoryPolicy::kDtr;
  const std::string text = config_changes_text(c);
  EXPECT_THAT(text, ::testing::HasSubstr("  [model] name = \"gpt\"\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  [training] steps = 300\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  [memory] policy = \"dtr\"\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  [data] dataset = "));  // required: always shown
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("eviction_threshold")));
}

TEST(ConfigText, TheReferencePageIsTheGeneratedOne) {
  std::ifstream in(std::string(HT_SOURCE_DIR) + "/docs/config-reference.md");
  ASSERT_TRUE(in) << "docs/config-reference.md is missing";
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(page, config_reference_markdown())
      << "regenerate it: ./build/launcher/hybrid_train --config-reference-markdown > docs/config-reference.md";
}

}  // namespace
}  // namespace ht::test
