// Test support for grammars on the real SmolLM2 vocabulary (random:smollm2-135m
// carries the default model's tokenizer): the tokenizer with a grammar
// vocabulary whose stop token is <|im_end|>, and uniform random walks through
// a grammar.
#ifndef TANDEM_TESTS_UNIT_GRAMMAR_WALK_H_
#define TANDEM_TESTS_UNIT_GRAMMAR_WALK_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/grammar/token_grammar.h"
#include "engine/model/random_model.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "gtest/gtest.h"

namespace tandem::testing {

class GrammarVocabularyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<model::GgufFile>> file =
        model::OpenRandomModel("random:smollm2-135m");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
        tokenizer::BpeTokenizer::FromGguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    ASSERT_TRUE(tokenizer_->Find("<|im_end|>").has_value());
    stop_ = *tokenizer_->Find("<|im_end|>");
    vocabulary_ = grammar::GrammarVocabulary::Create(*tokenizer_, std::vector<TokenId>{stop_});
  }

  using TokenId = tokenizer::TokenId;

  // Walks the grammar drawing uniformly among the allowed tokens (the worst
  // case for a model: any allowed token is as likely as any other) until the
  // stop token; the answer's text, or "" when it took over `limit` tokens.
  std::string RandomAnswer(std::shared_ptr<const grammar::CompiledGrammar> grammar, uint32_t seed,
                           int limit) {
    grammar::GrammarState state(std::move(grammar));
    grammar::TokenMask mask(tokenizer_->vocab_size());
    std::mt19937 rng(seed);
    std::vector<TokenId> answer;
    for (int step = 0; step < limit; ++step) {
      state.FillMask(&mask);
      std::vector<TokenId> allowed;
      for (TokenId id = 0; id < tokenizer_->vocab_size(); ++id) {
        if (mask.Allows(id)) allowed.push_back(id);
      }
      EXPECT_FALSE(allowed.empty());
      if (allowed.empty()) return "";
      const TokenId token = allowed[rng() % allowed.size()];
      EXPECT_TRUE(state.Accept(token));
      if (token == stop_) {
        EXPECT_TRUE(state.terminated());
        return tokenizer_->Decode(answer, /*skip_control=*/false);
      }
      answer.push_back(token);
    }
    ADD_FAILURE() << "no stop token within " << limit << " tokens";
    return "";
  }

  std::unique_ptr<model::GgufFile> file_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  TokenId stop_ = 0;
  std::unique_ptr<grammar::GrammarVocabulary> vocabulary_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_GRAMMAR_WALK_H_
