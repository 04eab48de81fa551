#pragma once
// Closed sets of choices (a memory policy, a precision, a pipeline schedule) as enums with their
// names in one table each. A choice is parsed from its name once, at the config's boundary
// (launcher/config/), and travels as its enum: code asks the enum's questions (does this policy
// evict?), never compares names. An enum E takes part by specializing ChoiceNames<E>:
//
//   template <> struct ChoiceNames<Fruit> {
//     static constexpr std::pair<Fruit, const char*> table[] = {{Fruit::kApple, "apple"}, ...};
//   };
//
// Its first entry is listed first in --help and error messages.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ht {

template <typename E>
struct ChoiceNames;  // specialized next to each enum

// Every value of E, in its table's order.
template <typename E>
std::vector<E> all_choices() {
  std::vector<E> out;
  for (const auto& [value, name] : ChoiceNames<E>::table) out.push_back(value);
  return out;
}

template <typename E>
std::vector<std::string> choice_names() {
  std::vector<std::string> out;
  for (const auto& [value, name] : ChoiceNames<E>::table) out.emplace_back(name);
  return out;
}

template <typename E>
const char* choice_name(E choice) {
  for (const auto& [value, name] : ChoiceNames<E>::table) {
    if (value == choice) return name;
  }
  return "?";
}

template <typename E>
std::optional<E> parse_choice(std::string_view text) {
  for (const auto& [value, name] : ChoiceNames<E>::table) {
    if (text == name) return value;
  }
  return std::nullopt;
}

// Whether E has a name table (the config schema reads such fields as strings).
template <typename E, typename = void>
struct is_choice : std::false_type {};
template <typename E>
struct is_choice<E, std::void_t<decltype(ChoiceNames<E>::table)>> : std::true_type {};

}  // namespace ht
