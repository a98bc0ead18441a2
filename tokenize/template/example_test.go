package template_test

import (
	"fmt"

	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/template"
)

func ExampleNew() {
	r, err := template.New(
		`{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}`+
			`{% if add_generation_prompt %}<|assistant|>{% endif %}`,
		template.Tokens{Named: map[string]string{"bos_token": "<s>", "eos_token": "</s>"}},
		template.Options{},
	)
	if err != nil {
		panic(err)
	}
	prompt, err := r.Render(tokenize.TextChat("system", "Be brief.", "user", "Hi!"))
	if err != nil {
		panic(err)
	}
	fmt.Println(prompt)
	// Output: <s><|system|>Be brief.</s><|user|>Hi!</s><|assistant|>
}
