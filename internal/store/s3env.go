package store

import (
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// envLoadOptions are the AWS SDK's load options for the settings getenv holds (Options.Getenv),
// so that a store given an environment does not read the process's: two stores with different
// credentials can live in one process. Nil getenv adds nothing; the SDK reads the process's.
func envLoadOptions(getenv func(string) string) []func(*config.LoadOptions) error {
	if getenv == nil {
		return nil
	}
	var opts []func(*config.LoadOptions) error
	if id := getenv("AWS_ACCESS_KEY_ID"); id != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(id, getenv("AWS_SECRET_ACCESS_KEY"), getenv("AWS_SESSION_TOKEN"))))
	}
	if r := firstSet(getenv, "AWS_REGION", "AWS_DEFAULT_REGION"); r != "" {
		opts = append(opts, config.WithRegion(r))
	}
	if p := firstSet(getenv, "AWS_PROFILE", "AWS_DEFAULT_PROFILE"); p != "" {
		opts = append(opts, config.WithSharedConfigProfile(p))
	}
	home := getenv("HOME")
	opts = append(opts,
		config.WithSharedConfigFiles(sharedFile(getenv("AWS_CONFIG_FILE"), home, "config")),
		config.WithSharedCredentialsFiles(sharedFile(getenv("AWS_SHARED_CREDENTIALS_FILE"), home, "credentials")))
	if strings.EqualFold(getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		opts = append(opts, config.WithEC2IMDSClientEnableState(imds.ClientDisabled))
	}
	return opts
}

// sharedFile is the shared config file the environment names, else the one under home/.aws;
// none (an empty list, not the SDK's default) without either.
func sharedFile(named, home, base string) []string {
	switch {
	case named != "":
		return []string{named}
	case home != "":
		return []string{filepath.Join(home, ".aws", base)}
	default:
		return []string{}
	}
}

func firstSet(getenv func(string) string, keys ...string) string {
	for _, k := range keys {
		if v := getenv(k); v != "" {
			return v
		}
	}
	return ""
}
